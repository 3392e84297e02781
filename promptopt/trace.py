"""Token-by-token δ_TCB along a greedy generation (the δ_TCB paper's Fig. 4 use): where the model's
commitment to its next token is locally fragile, δ_TCB dips sharply — often where the probability of the
second-best token spikes, while the running perplexity barely moves (the paper's App. D.3 point)."""

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


COLUMNS = [
    "step",
    "token",
    "tcb",
    "jacobian_norm",
    "v_eff",
    "margin",
    "top_prob",
    "p_second",
    "nll",
    "running_ppl",
    "dip",
]


def encode_prompt(lm: LoadedModel, text: str, *, chat: bool | None = None) -> list[int]:
    """Token ids of TEXT as a user turn of the chat template (default: when the model has one), else plain."""
    tok = lm.tokenizer
    use_chat = lm.has_chat_template if chat is None else chat
    if use_chat:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tok(rendered, add_special_tokens=False)["input_ids"]
    return tok(text)["input_ids"]


def trace_generation(
    lm: LoadedModel,
    text: str,
    *,
    max_new_tokens: int = 48,
    chat: bool | None = None,
    dip_ratio: float = 0.5,
    window: int = 8,
) -> pd.DataFrame:
    """One row per generated token: δ_TCB, ‖J‖_F, V_eff, margin, P(top-1) and P(2nd best) = P(top-1)·e^(−margin),
    −log p of the emitted token, the running perplexity exp(mean −log p so far), and the dip flag."""
    tok = lm.tokenizer
    ids = encode_prompt(lm, text, chat=chat)
    gen = Runner(lm, batch_size=1).generate([ids], max_new_tokens=max_new_tokens)[0]
    if not gen.tokens:
        return pd.DataFrame(columns=COLUMNS)
    with torch.inference_mode():
        res = lm.output_head(gen.hidden.to(lm.output_head.weight.device), target=torch.tensor(gen.tokens))
    tcb = res.tcb.cpu().numpy()
    top_prob, margin, nll = res.top_prob.cpu().numpy(), res.margin.cpu().numpy(), res.nll.cpu().numpy()
    return pd.DataFrame(
        {
            "step": np.arange(len(gen.tokens)),
            "token": [tok.decode([t]) for t in gen.tokens],
            "tcb": tcb,
            "jacobian_norm": res.jacobian_norm.cpu().numpy(),
            "v_eff": res.v_eff.cpu().numpy(),
            "margin": margin,
            "top_prob": top_prob,
            "p_second": top_prob * np.exp(-margin),  # o_2 / o_1 = e^(z_2 − z_1)
            "nll": nll,
            "running_ppl": np.exp(np.cumsum(nll) / np.arange(1, len(nll) + 1)),
            "dip": flag_dips(tcb, ratio=dip_ratio, window=window),
        }
    )


def plot_trace(frame: pd.DataFrame, path, *, title: str = "") -> None:
    """The paper's Fig. 4 as three stacked panels over the generated tokens: δ_TCB (log scale, dips marked),
    P(top-1) and P(2nd best), and the running perplexity. PNG or SVG by the file name; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from promptopt.yamlio import atomic_write_bytes_via

    steps = frame["step"].to_numpy()
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, 0.22 * len(frame) + 2), 6.5), sharex=True)
    finite = np.isfinite(frame["tcb"].to_numpy())
    axes[0].semilogy(steps[finite], frame["tcb"].to_numpy()[finite], marker="o", ms=3, lw=1, label="δ_TCB")
    dips = frame["dip"].to_numpy(dtype=bool) & finite
    axes[0].scatter(steps[dips], frame["tcb"].to_numpy()[dips], color="red", zorder=3, label="dip")
    axes[0].set_ylabel("δ_TCB")
    axes[0].legend(loc="best", fontsize=8)
    axes[1].semilogy(steps, frame["p_second"], lw=1, color="tab:orange", marker="o", ms=3, label="P(2nd best)")
    axes[1].set_ylabel("P(2nd best), log")
    top = axes[1].twinx()  # P(top-1) sits near 1 where the spikes of P(2nd) are small: its own linear axis
    top.plot(steps, frame["top_prob"], lw=1, color="tab:blue", alpha=0.6, label="P(top-1)")
    top.set_ylim(0, 1.02)
    top.set_ylabel("P(top-1)")
    axes[1].legend(loc="upper left", fontsize=8)
    top.legend(loc="upper right", fontsize=8)
    axes[2].plot(steps, frame["running_ppl"], lw=1, color="tab:green")
    axes[2].set_ylabel("running PPL")
    axes[2].set_xlabel("generated token")
    if len(frame) <= 80:
        axes[2].set_xticks(steps)
        axes[2].set_xticklabels([repr(t)[1:-1].replace(" ", "␣") for t in frame["token"]], rotation=90, fontsize=7)
    if title:
        axes[0].set_title(title)
    fig.tight_layout()
    fmt = str(path).rsplit(".", 1)[-1].lower()
    atomic_write_bytes_via(path, lambda p: fig.savefig(p, format=fmt, dpi=120))
    plt.close(fig)
