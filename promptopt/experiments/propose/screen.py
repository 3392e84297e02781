"""Screening: a proposed instruction enters the space only if it is not worse than the space's best hand-written
instruction beyond noise, on a small dev minibatch. Dev items only; test items never choose.

- Minibatch: the first `items` dev items (32 by default; the dev order is the task's seeded carving).
- Control: the task's default prompt (its template and shots) with each of the space's own instructions; the one
  with the highest minibatch accuracy (ties: the higher mean log p(gold), then the one listed first). Picking the
  best of several on the same items flatters the control, so screening errs towards rejecting.
- Candidate: the same prompt with the proposed instruction, scored on the same items (a paired comparison).
- Rule: a candidate is rejected (`worse_than_control`) when its minibatch accuracy is below the control's *and* a
  one-sided paired test says it is worse at α = 0.05: on choice tasks the Wilcoxon signed-rank test of the
  per-item log-probability of the gold answer normalised over the choices (the decision's own scores; the
  continuous counterpart of right/wrong, which on 32 items sees what 0/1 answers cannot), on generative tasks
  the exact McNemar test of right/wrong. Both parts are needed, as for a claim of "better" (DESIGN: honest
  selection): a candidate as accurate as the control is never rejected for being less confident.
- Cost: (hand-written + candidates) × items item scorings on the task's model (`seconds` records it; prompts
  already scored come from the result cache). Verdicts are kept in the proposals cache beside the proposals
  they screen, so `--resume` rebuilds the same space file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from promptopt import progress
from promptopt.card import sha256_json
from promptopt.tasks.item import items_sha256
from promptopt.yamlio import atomic_write_text

SCREEN_ITEMS = 32
ALPHA = 0.05
VERSION = 1  # bump when the rule, the control or the statistic changes


@dataclass
class Screening:
    """What screening measured: the control, every candidate's minibatch numbers and verdict, its cost."""

    items: int  # dev items in the minibatch
    control: str  # the control's instruction name
    control_accuracy: float
    test: str  # "wilcoxon log p(gold)" | "mcnemar"
    results: list[dict] = field(default_factory=list)  # name, text, accuracy, delta_logp, p, passed, why
    seconds: float = 0.0
    reused: bool = False

    @property
    def passed(self) -> list[str]:
        return [r["name"] for r in self.results if r["passed"]]

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "reused"}


def _gold_logp(table, metric: str) -> np.ndarray | None:
    """log p(gold | choices) per item from the decision's scores (acc_norm: the per-character ones); None when
    the table has no choices (a generative task)."""
    column = "choice_logprobs_norm" if metric == "acc_norm" else "choice_logprobs"
    if column not in table:
        return None
    out = []
    for scores, gold in zip(table[column], table["gold"]):
        s = np.asarray(scores, dtype=float)
        top = s.max()
        out.append(float(s[int(gold)] - (top + math.log(np.exp(s - top).sum()))))
    return np.asarray(out)


def _paired_worse(candidate, control, logp_candidate, logp_control) -> tuple[float, str]:
    """One-sided p that the candidate is worse than the control on the same items, and the test's name."""
    if logp_candidate is not None and logp_control is not None:
        from scipy.stats import wilcoxon

        diff = logp_candidate - logp_control
        if not np.any(diff != 0):
            return 1.0, "wilcoxon log p(gold)"
        return float(wilcoxon(diff, alternative="less").pvalue), "wilcoxon log p(gold)"
    from scipy.stats import binomtest

    worse = int(np.sum(control & ~candidate))
    better = int(np.sum(candidate & ~control))
    if worse + better == 0:
        return 1.0, "mcnemar"
    return float(binomtest(worse, worse + better, 0.5, alternative="greater").pvalue), "mcnemar"


def screen_key(session, proposals_key: str, hand_written: dict[str, str], items: int) -> str:
    dev = session.items("dev")[:items]
    return sha256_json(
        {
            "version": VERSION,
            "proposals": proposals_key,
            "hand_written": sorted(hand_written.items()),
            "prompt": session.data.default_prompt().to_card(),
            "dev": items_sha256(dev),
            "alpha": ALPHA,
            "model": session.model_config.spec,
            "dtype": session.model_config.resolved_dtype(),
        }
    )


def screen(
    session,
    hand_written: dict[str, str],
    candidates: list,
    *,
    items: int = SCREEN_ITEMS,
    key: str | None = None,
    cache_dir=None,
) -> Screening:
    """Score the space's own instructions and `candidates` (Proposal objects) on the first `items` dev items with
    the task's default prompt; keep the candidates not worse than the best hand-written one beyond noise."""
    cached = Path(cache_dir) / f"screen-{key[:24]}.json" if cache_dir is not None and key else None
    if cached is not None and cached.is_file():
        data = json.loads(cached.read_text(encoding="utf-8"))
        return Screening(**data, reused=True)
    started = time.perf_counter()
    dev = session.items("dev")[:items]
    base = session.data.default_prompt()
    metric = session.data.spec.metric

    def measure(text: str):
        table = session.scorer.score(dataclasses.replace(base, instruction=text), dev).table
        return table["correct"].to_numpy(dtype=bool), _gold_logp(table, metric)

    own = {}
    for name in progress.iterate(list(hand_written), f"screening: the space's {len(hand_written)} own instructions"):
        own[name] = measure(hand_written[name])
    order = list(hand_written)

    def rank(name):
        correct, logp = own[name]
        return (-correct.mean(), -(logp.mean() if logp is not None else 0.0), order.index(name))

    control = min(own, key=rank)
    control_correct, control_logp = own[control]
    result = Screening(len(dev), control, float(control_correct.mean()), "")
    for proposal in progress.iterate(candidates, f"screening {len(candidates)} proposals against {control}"):
        correct, logp = measure(proposal.text)
        p, result.test = _paired_worse(correct, control_correct, logp, control_logp)
        accuracy = float(correct.mean())
        worse = accuracy < result.control_accuracy and p < ALPHA
        entry = {
            "name": proposal.name,
            "text": proposal.text,
            "accuracy": accuracy,
            "delta_accuracy": accuracy - result.control_accuracy,
            "delta_logp": float(np.mean(logp - control_logp)) if logp is not None else None,
            "p": p,
            "passed": not worse,
        }
        if worse:
            entry["why"] = (
                f"minibatch accuracy {accuracy:.3f} vs {result.control_accuracy:.3f} for {control} on {len(dev)} dev "
                f"items, one-sided {result.test} p = {p:.2g} < {ALPHA}"
            )
        result.results.append(entry)
    result.test = result.test or ("wilcoxon log p(gold)" if control_logp is not None else "mcnemar")
    result.seconds = time.perf_counter() - started
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cached, json.dumps(result.to_json(), indent=1, ensure_ascii=False))
    return result


def apply(proposals, screening: Screening):
    """The proposals with screening's verdicts: the ones that failed move to `rejected` (reason
    worse_than_control, with the numbers) and are counted in `drops`."""
    verdicts = {r["name"]: r for r in screening.results}
    kept = [p for p in proposals.accepted if verdicts.get(p.name, {}).get("passed", True)]
    failed = [p for p in proposals.accepted if not verdicts.get(p.name, {}).get("passed", True)]
    drops = dict(proposals.drops)
    if failed:
        drops["worse_than_control"] = drops.get("worse_than_control", 0) + len(failed)
    rejected = list(proposals.rejected) + [
        {
            "text": p.text,
            "reason": "worse_than_control",
            "why": verdicts[p.name]["why"],
            "attempt": p.provenance.get("attempt"),
            "provenance": p.provenance,
        }
        for p in failed
    ]
    return dataclasses.replace(proposals, accepted=kept, rejected=rejected, drops=drops, screening=screening)
