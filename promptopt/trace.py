"""Token-by-token δ_TCB along a greedy generation (the δ_TCB paper's Fig. 4 use): where the model's
commitment to its next token is locally fragile, δ_TCB dips sharply."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from promptopt.models import LoadedModel, Runner


def flag_dips(values: np.ndarray, *, ratio: float = 0.5, window: int = 8, min_history: int = 3) -> np.ndarray:
    """True where a value falls below `ratio` × the median of the previous `window` values."""
    flags = np.zeros(len(values), dtype=bool)
    for i in range(min_history, len(values)):
        history = values[max(0, i - window) : i]
        history = history[np.isfinite(history)]
        if len(history) >= min_history and values[i] < ratio * np.median(history):
            flags[i] = True
    return flags


def trace_generation(
    lm: LoadedModel, text: str, *, max_new_tokens: int = 48, chat: bool | None = None, dip_ratio: float = 0.5, window: int = 8
) -> pd.DataFrame:
    """One row per generated token: δ_TCB, ‖J‖_F, V_eff, margin, −log p of the emitted token, dip flag."""
    tok = lm.tokenizer
    use_chat = lm.has_chat_template if chat is None else chat
    if use_chat:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tok(text)["input_ids"]
    gen = Runner(lm, batch_size=1).generate([ids], max_new_tokens=max_new_tokens)[0]
    if not gen.tokens:
        return pd.DataFrame(columns=["step", "token", "tcb", "jacobian_norm", "v_eff", "margin", "nll", "dip"])
    with torch.inference_mode():
        res = lm.output_head(gen.hidden.to(lm.output_head.weight.device), target=torch.tensor(gen.tokens))
    tcb = res.tcb.cpu().numpy()
    return pd.DataFrame(
        {
            "step": np.arange(len(gen.tokens)),
            "token": [tok.decode([t]) for t in gen.tokens],
            "tcb": tcb,
            "jacobian_norm": res.jacobian_norm.cpu().numpy(),
            "v_eff": res.v_eff.cpu().numpy(),
            "margin": res.margin.cpu().numpy(),
            "nll": res.nll.cpu().numpy(),
            "dip": flag_dips(tcb, ratio=dip_ratio, window=window),
        }
    )
