"""Screening: a proposed instruction enters the space only if it is not worse than the space's best hand-written
instruction beyond noise, on a small dev minibatch. Dev items only; test items never choose.

- Minibatch: the first `items` dev items (32 by default; the dev order is the task's seeded carving), in two halves.
- Control: the task's default prompt (its template and shots) with each of the space's own instructions, scored on
  the first half; the most accurate is the control (ties: the higher mean log p(gold), then the one listed first).
  Picking the best of several on the same items flatters the control, so screening errs towards rejecting.
- Candidate: the same prompt with the proposed instruction, on the same items (a paired comparison).
- Rule: a candidate is rejected (`worse_than_control`) when, on the whole minibatch, its accuracy is below the
  control's *and* a one-sided paired test says it is worse at α = 0.05: on choice tasks the Wilcoxon signed-rank
  test of the per-item log-probability of the gold answer normalised over the choices (the decision's own scores;
  the continuous counterpart of right/wrong, which on 32 items sees what 0/1 answers cannot), on generative tasks
  the exact McNemar test of right/wrong. Both parts are needed, as for a claim of "better" (DESIGN: honest
  selection): a candidate as accurate as the control is never rejected for being less confident.
- Two stages (a group-sequential version of that one test): a candidate at least as accurate as the control on the
  first half, with the one-sided p there ≥ 0.5 (no sign of being worse), is kept at once; any other is scored on
  the second half too and judged by the rule on the whole minibatch. Stage 1 can only keep earlier, never reject,
  so the rejections are a subset of the one-stage test's and a candidate that is not worse is still rejected less
  than 5% of the time; a clearly worse one shows it on the first half and goes on to be rejected.
- Cost: hand-written × items/2 + candidates × items/2 + (the control and each stage-2 candidate) × items/2 item
  scorings on the task's model (`scored_items`, `seconds`; prompts already scored come from the result cache).
  Verdicts are kept in the proposals cache beside the proposals they screen, so `--resume` rebuilds the same space
  file.
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
from promptopt.workflows.propose.filters import one_line
from promptopt.yamlio import atomic_write_text

SCREEN_ITEMS = 32
ALPHA = 0.05
EARLY_P = 0.5  # stage 1 keeps a candidate at once when it is as accurate as the control and this far from worse
MIN_STAGE = 4  # fewer minibatch items than 2 × this: one stage
VERSION = 2  # bump when the rule, the control, the stages or the statistic changes


@dataclass
class Screening:
    """What screening measured: the control, every candidate's minibatch numbers and verdict, its cost."""

    items: int  # dev items in the minibatch
    control: str  # the control's instruction name
    control_accuracy: float
    test: str  # "wilcoxon log p(gold)" | "mcnemar"
    results: list[dict] = field(default_factory=list)  # name, text, items, stage, accuracy, p, passed, why
    seconds: float = 0.0
    first_items: int = 0  # stage 1: the first half of the minibatch (where the control is chosen)
    scored_items: int = 0  # item scorings screening cost (hand-written and candidates, both stages)
    reused: bool = False
    control_text: str = ""  # the control's instruction text ("" for the space's empty instruction)

    @property
    def control_label(self) -> str:
        """How messages name the control: its text (shortened), not its key."""
        text = one_line(self.control_text, 60)
        return f'"{text}"' if text else "the empty instruction"

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


def _joined(a: tuple, b: tuple) -> tuple:
    """(correct, log p(gold)) of two parts of the minibatch, one after the other."""
    correct = np.concatenate([a[0], b[0]])
    logp = np.concatenate([a[1], b[1]]) if a[1] is not None and b[1] is not None else None
    return correct, logp


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
        data.setdefault("control_text", hand_written.get(data["control"], ""))  # verdicts written before it was kept
        return Screening(**data, reused=True)
    started = time.perf_counter()
    dev = session.items("dev")[:items]
    first, second = (dev[: len(dev) // 2], dev[len(dev) // 2 :]) if len(dev) >= 2 * MIN_STAGE else (dev, [])
    base = session.data.default_prompt()
    metric = session.data.spec.metric
    scored = 0

    def measure(text: str, part: list):
        nonlocal scored
        if not part:
            return np.zeros(0, dtype=bool), None
        scored += len(part)
        table = session.scorer.score(dataclasses.replace(base, instruction=text), part).table
        return table["correct"].to_numpy(dtype=bool), _gold_logp(table, metric)

    own = {}
    for name in progress.iterate(list(hand_written), f"screening: the space's {len(hand_written)} own instructions"):
        own[name] = measure(hand_written[name], first)
    order = list(hand_written)

    def rank(name):
        correct, logp = own[name]
        return (-correct.mean(), -(logp.mean() if logp is not None else 0.0), order.index(name))

    control = min(own, key=rank)
    result = Screening(
        len(dev),
        control,
        float(own[control][0].mean()),
        "",
        first_items=len(first),
        control_text=hand_written[control],
    )
    whole_control = None  # the control on every minibatch item, scored when a candidate first needs it

    for proposal in progress.iterate(
        candidates, f"screening {len(candidates)} proposals against {result.control_label}"
    ):
        correct, logp = measure(proposal.text, first)
        p, result.test = _paired_worse(correct, own[control][0], logp, own[control][1])
        accuracy = float(correct.mean())
        entry = {"name": proposal.name, "text": proposal.text, "items": len(first), "stage": 1}
        if (accuracy >= result.control_accuracy and p >= EARLY_P) or not second:
            entry.update(accuracy=accuracy, control_accuracy=result.control_accuracy, p=p)
        else:  # not clearly fine on the first half: judged on the whole minibatch
            if whole_control is None:
                rest = measure(hand_written[control], second)
                whole_control = _joined(own[control], rest)
            correct, logp = _joined((correct, logp), measure(proposal.text, second))
            p, result.test = _paired_worse(correct, whole_control[0], logp, whole_control[1])
            accuracy = float(correct.mean())
            entry.update(
                items=len(dev), stage=2, accuracy=accuracy, control_accuracy=float(whole_control[0].mean()), p=p
            )
        worse = accuracy < entry["control_accuracy"] and p < ALPHA  # stage-1 keeps are neither
        entry["passed"] = not worse
        if worse:
            entry["why"] = (
                f"minibatch accuracy {accuracy:.3f} vs {entry['control_accuracy']:.3f} for {result.control_label} on "
                f"{entry['items']} dev items, one-sided {result.test} p = {p:.2g} < {ALPHA}"
            )
        result.results.append(entry)
    result.test = result.test or ("wilcoxon log p(gold)" if own[control][1] is not None else "mcnemar")
    result.seconds = time.perf_counter() - started
    result.scored_items = scored
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
