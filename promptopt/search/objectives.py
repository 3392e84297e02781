"""Search strategies: what a trial's per-item results are worth, and how the winner is chosen.

Each single-objective strategy scores an item i and the trial's value is the mean over the dev items,
so per-item values can be reported to a paired pruner (Optuna's WilcoxonPruner) as they arrive.

| strategy       | trial value (mean over dev items)                     | winner                               |
|----------------|-------------------------------------------------------|--------------------------------------|
| `accuracy`     | correct_i                                             | best value                           |
| `ppl`          | −nll_i: NLL per token of the gold *final answer*      | best value (the δ_TCB paper's        |
|                | (after the reference reasoning for GSM8K-style golds) |   PPL-guided baseline; nothing else) |
| `ppl_solution` | −NLL per token of the whole reference target          | best value                           |
| `acc_ppl`      | correct_i − 0.1·NLL per token of the whole target     | best value (the former `ppl` blend)  |
| `tcb`          | correct_i + 0.25·sign_i·stability_i                   | constrained: the most stable trial   |
|                |                                                       |   among those whose dev accuracy is  |
|                |                                                       |   inside the best one's 95% interval |
| `acc_tcb`      | same value as `tcb`                                   | best value (the former `tcb`)        |
| `pareto`       | (accuracy, mean signed stability), NSGA-II            | highest accuracy on the front        |
| `robust`       | correct_i ∧ every cheap perturbed variant of i        | best value (robust dev accuracy)     |
|                | correct (synonym, keyboard typo, exemplar reorder)    |                                      |

stability_i = (clip(log10 δ_TCB,i, −1, 5) + 1) / 6 ∈ [0, 1] (scale-free: δ spans 1 … 50,000);
sign_i = +1 when item i is correct, −1 when wrong, so a stably wrong answer is penalized, never rewarded.

Why `tcb` selects with a constraint: as a weighted sum, stability moved a trial's value by 0.015–0.035
while accuracy moved it by 0.25 on the demo, so δ_TCB never changed a decision. The constraint gives it
a decision to make that accuracy cannot: among prompts whose dev accuracies are statistically
indistinguishable from the best (inside its 95% Wilson interval), take the one whose answers are most
stable. The blend still guides the sampler (and the pruner); `acc_tcb` keeps the plain best value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.errors import ConfigError
from promptopt.metrics.stats import wilson_interval

LAMBDA_PPL = 0.1
LAMBDA_TCB = 0.25
_LOG_TCB_RANGE = (-1.0, 5.0)


def stability(tcb: np.ndarray | pd.Series) -> np.ndarray:
    """Scale-free stability in [0, 1]: clipped log10 δ_TCB (δ = +inf maps to 1)."""
    lo, hi = _LOG_TCB_RANGE
    values = np.asarray(tcb, dtype=float)
    logs = np.where(np.isposinf(values), hi, np.log10(np.clip(values, 1e-300, None)))
    logs = np.where(np.isnan(values), lo, logs)  # no critical point: no credit
    return (np.clip(logs, lo, hi) - lo) / (hi - lo)


def signed_stability(table: pd.DataFrame) -> np.ndarray:
    sign = np.where(table["correct"].to_numpy(dtype=bool), 1.0, -1.0)
    return sign * stability(table["tcb"])


def _answer_nll(table: pd.DataFrame) -> np.ndarray:
    if "answer_nll" in table:
        return table["answer_nll"].to_numpy(dtype=float)
    return np.log(table["ppl"].to_numpy(dtype=float))  # rows cached before answer_nll existed


@dataclass(frozen=True)
class Strategy:
    name: str
    directions: tuple[str, ...]
    description: str
    selection: str = "best"  # best | stable_within_ci
    needs_variants: bool = False  # the trial value reads perturbed variants of the dev items


    @property
    def multi_objective(self) -> bool:
        return len(self.directions) > 1

    def item_values(self, table: pd.DataFrame) -> np.ndarray:
        """Per-item contributions (single-objective strategies only); their mean is the trial value."""
        correct = table["correct"].to_numpy(dtype=float)
        if self.name == "accuracy":
            return correct
        if self.name == "ppl":
            return -_answer_nll(table)
        if self.name == "ppl_solution":
            return -np.log(table["ppl"].to_numpy(dtype=float))
        if self.name == "acc_ppl":
            return correct - LAMBDA_PPL * np.log(table["ppl"].to_numpy(dtype=float))  # log ppl = nll per token
        if self.name in ("tcb", "acc_tcb"):
            return correct + LAMBDA_TCB * signed_stability(table)
        if self.name == "robust":
            return table["robust_correct"].to_numpy(dtype=float)
        raise ValueError(f"{self.name} has no per-item value")

    def values(self, table: pd.DataFrame) -> tuple[float, ...]:
        if self.name == "pareto":
            return float(table["correct"].mean()), float(signed_stability(table).mean())
        return (float(self.item_values(table).mean()),)


def select_winner(strategy: Strategy, candidates: list[dict]) -> tuple[dict, str]:
    """The winning trial and a sentence saying how it was chosen.

    candidates: finished trials as dicts with number, value (or values), accuracy, signed_stability, n."""
    if not candidates:
        raise ValueError("no finished trial to choose from")
    if strategy.multi_objective:
        best = max(candidates, key=lambda t: (t["values"][0], t["values"][1], -t["number"]))
        return best, "highest dev accuracy on the Pareto front (ties: higher signed stability)"
    best = max(candidates, key=lambda t: (t["value"], -t["number"]))
    if strategy.selection != "stable_within_ci":
        return best, f"best {strategy.name} value on dev"
    low, _ = wilson_interval(round(best["accuracy"] * best["n"]), best["n"])
    eligible = [t for t in candidates if t["accuracy"] >= low]
    winner = max(eligible, key=lambda t: (t["signed_stability"], t["accuracy"], -t["number"]))
    how = (f"most stable (mean signed stability {winner['signed_stability']:.3f}) of {len(eligible)} trials whose dev "
           f"accuracy is inside the best trial's 95% interval (≥ {low:.3f}; best #{best['number']} at {best['accuracy']:.3f})")
    return winner, how


STRATEGIES = {
    "accuracy": Strategy("accuracy", ("maximize",), "dev accuracy only"),
    "ppl": Strategy("ppl", ("maximize",), "−NLL per token of the gold final answer (the δ_TCB paper's PPL-guided baseline)"),
    "ppl_solution": Strategy("ppl_solution", ("maximize",), "−NLL per token of the whole reference target"),
    "acc_ppl": Strategy("acc_ppl", ("maximize",), f"accuracy − {LAMBDA_PPL}·NLL per token of the whole target"),
    "tcb": Strategy("tcb", ("maximize",), "most stable prompt among those as accurate as the best (95% interval)",
                    selection="stable_within_ci"),
    "acc_tcb": Strategy("acc_tcb", ("maximize",), f"accuracy + {LAMBDA_TCB}·mean signed stability"),
    "pareto": Strategy("pareto", ("maximize", "maximize"), "Pareto front of (accuracy, mean signed stability)"),
    "robust": Strategy("robust", ("maximize",), "dev accuracy counting an item only if its cheap perturbed variants are right too",
                       needs_variants=True),
}


def get_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy '{name}': use one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
