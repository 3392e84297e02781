"""The "diverse prompt set" the geometry, regimes and approximation analyses read: real next-token states.

Three sources, so that the V_eff range spans peaked and flat states (answer positions alone are almost all
V_eff < 20 on small instruct models):
- critical: the critical points of log-likelihood tasks (default sst2, arc_easy, arc_challenge, mmlu; the
  task's own prompt on the first `limit` test items): the state that predicts the first answer token,
  exactly as the scorer reads it (same lm-eval encoding, same prefix-cached runner). boolq works too but its
  passages make it the slowest by far, so it is not a default;
- text: states inside the same tasks' question texts read on their own (each predicts the next token of
  running text), `text_per_task` of them evenly spaced over the first few questions;
- trace: every generated token of short greedy generations of a few fixed open prompts (`trace`).

Each position keeps its final hidden state h, so analyses that change W or hold o fixed can recompute
anything. Collected positions are cached in the output folder under a key of everything that defines them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from promptopt import progress as steps
from promptopt.analyses.diagnose.output import v_eff_band
from promptopt.errors import UserError

DEFAULT_TASKS = ("sst2", "arc_easy", "arc_challenge", "mmlu")
TRACE_PROMPTS = (
    "Write one sentence about the sea.",
    "Tell me a short story about a dragon who loves tea.",
    "List the numbers from 1 to 30, separated by commas.",
    "What is the capital of Australia? Explain briefly.",
)
METRIC_COLUMNS = (
    "tcb",
    "jacobian_norm",
    "v_eff",
    "margin",
    "entropy",
    "top_prob",
    "tcb_approx",
    "tcb_diffuse",
    "s2",
    "s3",
)


@dataclass
class Positions:
    frame: pd.DataFrame  # one row per position: source, task, item_id, step, token, δ_TCB and companions, band
    hidden: torch.Tensor  # (N, d) float32, row i is the state of frame row i


@dataclass(frozen=True, kw_only=True)
class PositionSpec:
    """What defines a position set (and its cache key)."""

    tasks: tuple[str, ...] = DEFAULT_TASKS
    limit: int = 40
    split: str = "test"
    text_per_task: int = 24
    trace_prompts: tuple[str, ...] = TRACE_PROMPTS
    trace_tokens: int = 32

    def __post_init__(self) -> None:
        if min(self.limit, self.trace_tokens, self.text_per_task) < 0:
            raise UserError("limit, text positions and trace tokens must be >= 0")
        if not self.tasks and not (self.trace_prompts and self.trace_tokens):
            raise UserError("no positions: give at least one task or trace prompt")

    def key(self, model_name: str) -> str:
        blob = json.dumps({"model": model_name, **self.__dict__}, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def critical_states(scorer, prompt, items) -> torch.Tensor:
    """Final hidden states at each item's critical point (the state predicting the answer's first token).

    Uses the scorer's own encoding (`_pairs`: trailing context spaces move into the continuation, as in
    lm-eval) and runner, so the states are the ones `Scorer.score` reads δ_TCB from."""
    if scorer.data.spec.answer.generative:
        raise UserError(
            f"task {scorer.data.spec.name} is generative: positions come from log-likelihood tasks "
            "(and from the trace generations)"
        )
    tok = scorer.lm.tokenizer
    contexts = [prompt.context(item.question, item.choices, tok) for item in items]
    golds = [prompt.continuation(prompt.choice_texts(item.choices)[item.gold]) for item in items]
    pairs = scorer._pairs(contexts, golds, prompt, [item.id for item in items])
    results = scorer.runner.loglikelihood([(ctx, cont[:1]) for ctx, cont in pairs])
    return torch.stack([r.hidden for r in results])


def _text_states(lm, task_name: str, items, n: int) -> tuple[torch.Tensor, pd.DataFrame]:
    """n states evenly spaced over the positions of the first questions' text (read without the prompt);
    each predicts the next token of the question. The first position of each text is skipped (no context)."""
    tok = lm.tokenizer
    hidden, ids_of, steps = [], [], []
    for item in items:
        ids = tok(item.question)["input_ids"][:256]
        if len(ids) < 3:
            continue
        with torch.inference_mode():
            out = lm.base(input_ids=torch.tensor([ids], device=lm.device)).last_hidden_state[0, 1:-1].float().cpu()
        hidden.append(out)
        ids_of += [item.id] * out.shape[0]
        steps += list(range(1, out.shape[0] + 1))
        if sum(h.shape[0] for h in hidden) >= 4 * n:
            break
    if not hidden:
        return torch.empty(0, lm.output_head.hidden_size), pd.DataFrame(
            columns=["source", "task", "item_id", "step", "token"]
        )
    every = torch.cat(hidden)
    pick = np.unique(np.linspace(0, every.shape[0] - 1, min(n, every.shape[0])).round().astype(int))
    frame = pd.DataFrame(
        {
            "source": "text",
            "task": task_name,
            "item_id": np.array(ids_of)[pick],
            "step": np.array(steps)[pick],
            "token": "",
        }
    )
    return every[pick], frame


def _metrics(lm, hidden: torch.Tensor) -> dict[str, np.ndarray]:
    head = lm.output_head
    with torch.inference_mode():
        res = head(hidden.to(head.weight.device))
    out = {name: getattr(res, name).cpu().numpy() for name in METRIC_COLUMNS}
    out["top_token"] = res.top_token.cpu().numpy()
    return out


def collect_positions(lm, spec: PositionSpec, *, cache_dir: Path | None = None, progress: bool = False) -> Positions:
    """Positions of `spec` on model `lm` (read from / written to cache_dir when given)."""
    from promptopt.models import Runner
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task
    from promptopt.trace import encode_prompt
    from promptopt.yamlio import atomic_write_bytes_via

    cache = None if cache_dir is None else Path(cache_dir) / f"positions-{spec.key(lm.name)}.pt"
    if cache is not None and cache.is_file():
        steps.step(f"positions read back from {cache}")
        saved = torch.load(cache, weights_only=True)
        return Positions(pd.DataFrame(saved["frame"]), saved["hidden"])
    frames, states = [], []
    for name in spec.tasks:
        task = load_task(name)
        items = task.split(spec.split)[: spec.limit]
        if not items:
            raise UserError(f"task {name}: no {spec.split} items")
        steps.step(f"critical states: task {name}, {len(items)} {spec.split} items")
        scorer = Scorer(lm, task, progress=progress)
        hidden = critical_states(scorer, task.default_prompt(), items)
        states.append(hidden)
        frames.append(
            pd.DataFrame(
                {
                    "source": "critical",
                    "task": task.spec.name,
                    "item_id": [i.id for i in items],
                    "step": -1,
                    "token": "",
                }
            )
        )
        if spec.text_per_task:
            steps.step(f"{spec.text_per_task} positions inside {name}'s question texts")
            text_hidden, text_frame = _text_states(lm, task.spec.name, items, spec.text_per_task)
            states.append(text_hidden)
            frames.append(text_frame)
    if spec.trace_prompts and spec.trace_tokens:
        steps.step(
            f"trace positions: {spec.trace_tokens} generated tokens for each of {len(spec.trace_prompts)} prompts"
        )
        runner = Runner(lm, batch_size=len(spec.trace_prompts), progress=progress)
        gens = runner.generate(
            [encode_prompt(lm, text) for text in spec.trace_prompts], max_new_tokens=spec.trace_tokens
        )
        for index, gen in enumerate(gens):
            if not gen.tokens:
                continue
            states.append(gen.hidden.float())
            frames.append(
                pd.DataFrame(
                    {
                        "source": "trace",
                        "task": "",
                        "item_id": f"trace-{index}",
                        "step": np.arange(len(gen.tokens)),
                        "token": [lm.tokenizer.decode([t]) for t in gen.tokens],
                    }
                )
            )
    hidden = torch.cat(states).float()
    frame = pd.concat(frames, ignore_index=True)
    steps.step(f"δ_TCB, V_eff and margin at {len(frame)} positions")
    for name, values in _metrics(lm, hidden).items():
        frame[name] = values
    frame["band"] = v_eff_band(frame["v_eff"]).to_numpy()
    if cache is not None:
        payload = {"frame": frame.to_dict(orient="list"), "hidden": hidden}
        atomic_write_bytes_via(cache, lambda p: torch.save(payload, p))
    return Positions(frame, hidden)
