"""The incumbent: the prompt the user already has (the task's default prompt, or a card), scored first on the same dev
items as every trial, and kept unless a searched candidate beats it on dev by a paired test.

Why: the best of twenty noisy dev estimates flatters itself (a winner's curse), and on tasks whose space holds no
better prompt a search used to ship a tie or a loss against the prompt the user started from. MIPROv2 evaluates the
default program first and returns a candidate only if it scores higher; we add the test.

The incumbent lives in the study as one COMPLETE trial whose only parameter is `incumbent` (its value names where the
prompt came from), with its per-item dev values as intermediate values, so Optuna's own machinery (the pruner's
reference, `best_trial`, trials.csv, the dashboard) sees it like any trial; it never counts towards the trial budget
(`is_incumbent`). `decode` (study/context.py) answers its parameters with the incumbent prompt.

The replacement test (`replacement`): the searched winner against the incumbent on every dev item, by the strategy's
own per-item quantity: binary criteria (correctness; robust correctness) by the project's rule for "better" — exact
McNemar p < alpha and the 95% paired bootstrap interval above 0, both — and continuous objectives (−NLL for the
PPL-guided strategies) by the Wilcoxon signed-rank test and the same bootstrap interval, both. Uncorrected for the
number of trials searched: the winner's lead is flattered by selection, which only makes the incumbent easier to
replace, and the test still requires a lead that dev could not plausibly produce by chance for that one pair."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from promptopt.errors import ConfigError, UserError

INCUMBENT_PARAM = "incumbent"  # the one parameter of the incumbent's trial
INCUMBENT_CHOICES = ("default", "none")  # or a card's path


def check_incumbent(value: str) -> str:
    """`--incumbent default | none | CARD.yaml`: a card must be a file (it is validated when the run starts)."""
    if value in INCUMBENT_CHOICES:
        return value
    if not Path(value).is_file():
        raise ConfigError(f"incumbent: expected default, none or a prompt card's path, got {value!r} (no such file)")
    return value


def incumbent_prompt(setting: str, data, decision: str | None = None):
    """The Prompt the run starts from: the task's default prompt (decided by the run's one rule `decision` when it has
    one, so `accuracy@batch` asks whether a searched prompt beats the default prompt under `batch`), a card's prompt
    (with its own rule), or None (`none`)."""
    if setting == "none":
        return None
    if setting == "default":
        prompt = data.default_prompt()
        return prompt if decision is None else replace(prompt, decision=decision)
    from promptopt.prompts import load_card

    prompt, _ = load_card(setting)
    if prompt.task != data.spec.name:
        raise UserError(f"--incumbent {setting}: the card is a prompt for task '{prompt.task}', not '{data.spec.name}'")
    return prompt


def label(setting: str, decision: str | None = None) -> str:
    """How a run names its incumbent (`--incumbent` and the run's one rule)."""
    if setting != "default":
        return f"the card {setting}"
    return "the task's default prompt" + (f" decided by {decision}" if decision not in (None, "argmax") else "")


def is_incumbent(trial) -> bool:
    return INCUMBENT_PARAM in trial.params


def find(study):
    """The study's incumbent trial, or None."""
    return next((t for t in study.get_trials(deepcopy=False) if is_incumbent(t)), None)


@dataclass(frozen=True)
class Replacement:
    """The searched winner against the incumbent on the same dev items."""

    replaced: bool
    test: str  # which paired test decided
    diff: float  # winner − incumbent, in the strategy's per-item quantity
    interval: tuple[float, float]
    p: float
    n_items: int
    mde: float  # the smallest accuracy difference these dev items detect (binary criteria; NaN otherwise)
    why: str  # one line

    def record(self) -> dict:
        return {
            "replaced": self.replaced,
            "test": self.test,
            "diff": round(self.diff, 6),
            "ci95": [round(self.interval[0], 6), round(self.interval[1], 6)],
            "p": round(self.p, 6),
            "n_dev_items": self.n_items,
            "mde": None if math.isnan(self.mde) else round(self.mde, 6),
            "why": self.why,
        }


def replacement(
    winner: list, incumbent: list, *, binary: bool, winner_name: str, incumbent_name: str, alpha: float = 0.05, seed=0
) -> Replacement:
    """Whether `winner` beats `incumbent` (their per-item values on the same dev items) by the paired rule (module
    docstring), with the one line a run prints."""
    import numpy as np

    from promptopt.metrics.stats.binomial import mcnemar_exact
    from promptopt.metrics.stats.bootstrap import bootstrap_draws, percentile_interval
    from promptopt.metrics.stats.selection import minimum_detectable_effect

    w, b = np.asarray(winner, dtype=float), np.asarray(incumbent, dtype=float)
    if w.shape != b.shape or not len(w):
        raise ValueError(f"winner and incumbent need values on the same dev items: {w.shape} vs {b.shape}")
    n = len(w)
    d = w - b
    low, high = percentile_interval(bootstrap_draws(n, seed=seed) @ d / n)
    if binary:
        only_w, only_b, p = mcnemar_exact(w.astype(bool), b.astype(bool))
        test = "exact McNemar and 95% paired bootstrap interval, both"
        mde = minimum_detectable_effect(n, float(np.mean(w != b)))
        counts = f"; {only_w} items right only with {winner_name}, {only_b} only with {incumbent_name}"
    else:
        from scipy.stats import wilcoxon

        p = 1.0 if not np.any(d) else float(wilcoxon(w, b).pvalue)
        test = "Wilcoxon signed-rank and 95% paired bootstrap interval, both"
        mde, counts = math.nan, ""
    diff = float(d.mean())
    replaced = bool(p < alpha and low > 0)
    quantity = "accuracy" if binary else "per-item objective"
    numbers = f"dev {quantity} difference {diff:+.3f} [{low:+.3f}, {high:+.3f}], p = {p:.3g} on {n} items{counts}"
    detect = f"; these dev items detect differences of about {mde:.3f}" if not math.isnan(mde) else ""
    if replaced:
        why = f"{winner_name} replaces {incumbent_name}: better on dev ({numbers}; {test})"
    else:
        why = (
            f"kept {incumbent_name}: {winner_name}, the best searched prompt, is not significantly better on dev "
            f"({numbers}; {test}){detect}"
        )
    return Replacement(replaced, test, diff, (low, high), p, n, mde, why)


__all__ = [
    "INCUMBENT_PARAM",
    "Replacement",
    "check_incumbent",
    "find",
    "incumbent_prompt",
    "is_incumbent",
    "replacement",
]
