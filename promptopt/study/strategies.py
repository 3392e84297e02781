"""Search strategies: what a trial's per-item results are worth, and how the winner is chosen.

Each single-objective strategy scores an item i and the trial's value is the mean over the dev items,
so per-item values can be reported to a paired pruner (Optuna's WilcoxonPruner) as they arrive.

| strategy       | trial value (mean over dev items)                     | tie-break (winner, below)            |
|----------------|-------------------------------------------------------|--------------------------------------|
| `accuracy`     | correct_i                                             | the run's `--tie-break` (default     |
|                |                                                       |   `stability`)                       |
| `ppl`          | −nll_i: NLL per token of the gold *final answer*      | `value`: the lowest answer NLL (the  |
|                | (after the reference reasoning for GSM8K-style golds) |   δ_TCB paper's PPL-guided baseline) |
| `ppl_solution` | −NLL per token of the whole reference target          | `value`                              |
| `acc_ppl`      | correct_i − 0.1·NLL per token of the whole target     | `value` (the former `ppl` blend)     |
| `tcb`          | correct_i + 0.25·sign_i·stability_i                   | `stability`: the most stable trial   |
| `acc_tcb`      | same value as `tcb`                                   | `value` (the former `tcb`)           |
| `pareto`       | (accuracy, mean signed stability), NSGA-II            | `stability`, among the front         |
| `robust`       | correct_i ∧ every cheap perturbed variant of i        | `value` (robust dev accuracy; its    |
|                | correct (synonym, keyboard typo, exemplar reorder);   |   tie set pairs robust_correct)      |
|                | multi-fidelity, see below                             |                                      |

The winner (every strategy, one rule: promptopt/metrics/stats/selection.py): the trials not significantly worse than
the most accurate on the same dev items (paired: exact McNemar and the 95% paired bootstrap interval, both) tie, and
the tie-break chooses among them (remaining ties: higher dev accuracy, then the lower trial number). A strategy that
stands for a guide (PPL, δ_TCB, robustness) breaks ties by it, so each guide chooses where dev accuracy cannot;
`--tie-break` overrides it for every strategy. The card and summary.json record the tie set and why. Only COMPLETE
trials are candidates: a trial the paired pruner stopped was likely worse, and one `robust`'s bound stopped could
not beat the incumbent (with `--tie-break` other than `value` it might have tied: the tie set then holds the
trials that completed).

stability_i = (clip(log10 δ_TCB,i, −1, 5) + 1) / 6 ∈ [0, 1] (scale-free: δ spans 1 … 50,000);
sign_i = +1 when item i is correct, −1 when wrong, so a stably wrong answer is penalized, never rewarded.

Why `tcb` selects with a constraint: as a weighted sum, stability moved a trial's value by 0.015–0.035
while accuracy moved it by 0.25 on the demo, so δ_TCB never changed a decision. The tie set gives it a decision to
make that accuracy cannot: among prompts whose dev accuracies are statistically indistinguishable from the best,
take the one whose answers are most stable. (It was the best one's 95% Wilson interval before the paired rule: an
unpaired interval, which ignored that the prompts answer the same items.) The blend still guides the sampler (and
the pruner); `acc_tcb` keeps the plain best value.

`robust` is multi-fidelity: an item's perturbed variants are scored only for trials still alive under
the accuracy pruner (not successive-halving rungs). Two rungs per trial (study/trial.py runs them):
1. clean: every dev item on the clean prompt, minibatch by minibatch; per-item *clean correctness* goes to
   the paired pruner (`screen_values`), so a trial clearly less accurate than the incumbent (the best
   robust trial; its reported values are its clean ones too) is pruned before any variant is scored;
2. variants: only for a trial that survived the whole dev set, and only while it can still win. Its
   clean correctness bounds its robust correctness from above (robust_i ≤ correct_i), so it is pruned
   without a variant when that bound is below the incumbent's robust value, and during the rung as soon
   as (robust so far + clean-correct items still to check) is; a clean-wrong item is not robust whatever
   its variants say, and an item that failed one variant is not scored on the others.
A COMPLETE trial's value is still its robust accuracy on every dev item, so values stay comparable; the
bound prunes only trials that cannot beat the incumbent. With pruning off every trial completes (the
bound is pruning too), but the last point still holds. Why: scoring every cheap variant of every dev item
of every trial made `robust` about 4× the pairs of `accuracy`; `bench/bench_search.py` [3c] measures it.
The version before this one (`multi_fidelity=False`: variants for every item, robust values reported to
the pruner) is `Strategy.version` 1; a study of it is refused on --resume (study/identity.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.errors import ConfigError
from promptopt.registry import Registry

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


# --- per-item values: table of one trial's dev items -> one value per item; the trial value is their mean ----
def accuracy_values(table: pd.DataFrame) -> np.ndarray:
    return table["correct"].to_numpy(dtype=float)


def answer_nll_values(table: pd.DataFrame) -> np.ndarray:
    return -_answer_nll(table)


def solution_nll_values(table: pd.DataFrame) -> np.ndarray:
    return -np.log(table["ppl"].to_numpy(dtype=float))  # log ppl = nll per token of the whole target


def accuracy_ppl_values(table: pd.DataFrame) -> np.ndarray:
    return accuracy_values(table) - LAMBDA_PPL * np.log(table["ppl"].to_numpy(dtype=float))


def accuracy_tcb_values(table: pd.DataFrame) -> np.ndarray:
    return accuracy_values(table) + LAMBDA_TCB * signed_stability(table)


def robust_values(table: pd.DataFrame) -> np.ndarray:
    return table["robust_correct"].to_numpy(dtype=float)


# --- the winner: every strategy chooses through the one selection rule (metrics/stats/selection.py) ---------------
# Candidates are finished trials (dicts with number, value or values, accuracy, signed_stability, correct: the
# per-item dev correctness, and optionally cost and calibrated). The tie set is the trials not significantly worse
# than the most accurate on the same dev items (paired); the strategy's tie-break chooses within it.
def candidate_of(trial: dict):
    """A finished trial as the selection rule sees it (dev numbers only)."""
    from promptopt.metrics.stats.selection import Candidate

    value = trial.get("value")
    return Candidate(
        key=trial["number"],
        label=f"#{trial['number']}",
        correct=list(trial.get("criterion") or trial["correct"]),
        order=trial["number"],
        stability=float(trial.get("signed_stability", float("nan"))),
        cost=float(trial.get("cost", float("nan"))),
        calibrated=bool(trial.get("calibrated", False)),
        value=float("nan") if value is None else float(value),
    )


def pareto_values(table: pd.DataFrame) -> tuple[float, float]:
    return float(table["correct"].mean()), float(signed_stability(table).mean())


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """What a trial is worth and how the winner is chosen. Single-objective strategies give a value per dev
    item (`item_values`; the trial value is their mean, reported to the paired pruner as items arrive);
    multi-objective ones give the trial's values directly (`trial_values`). Keyword arguments only; register one
    with `register_strategy` (docs/recipes.md).

    Attributes:
        name: what `--strategy` and the registry call it.
        description: one line for tables and help.
        item_values: table of one trial's dev items -> one value per item (single objective).
        trial_values: table -> the trial's values (multi-objective); give exactly one of the two.
        criterion: the per-item dev column the tie set is paired on (`correct`, or `robust_correct`).
        tie_break: how the selection rule chooses among tied trials (None: the run's `--tie-break`).
        needs_variants: its values read perturbed variants of the dev items.
        multi_fidelity: score variants only for trials that can still win (needs `screen_values`).
        screen_values: the clean upper bound of `item_values` a multi-fidelity strategy reports to the pruner.
        version: what its values mean; bump it when that changes, so `--resume` refuses older studies.
        reads_tcb: its values read δ_TCB.
        replace_on: what the incumbent's replacement test pairs: "criterion" or "values".

    Raises:
        ValueError: both or neither of `item_values` and `trial_values`, or inconsistent multi-fidelity settings.
    """

    name: str
    description: str
    # the per-item dev answers the tie set is paired on: clean correctness, or `robust_correct` (right on the clean
    # prompt and every variant) for `robust`, whose multi-fidelity bound then stays exact: with its tie-break `value`
    # the winner is the highest robust value, the incumbent the bound compares with (trial.py `cannot_win`)
    criterion: str = "correct"
    # how the winner is chosen within the tie set (metrics/stats/selection.py TIE_BREAKS); None: the run's
    # --tie-break, else DEFAULT_TIE_BREAK. A strategy that stands for a guide other than accuracy breaks ties by it.
    tie_break: str | None = None
    item_values: Callable[[pd.DataFrame], np.ndarray] | None = None
    trial_values: Callable[[pd.DataFrame], tuple[float, ...]] | None = None
    needs_variants: bool = False  # the trial value reads perturbed variants of the dev items
    # needs_variants only: report `screen_values` (clean, an upper bound of item_values) to the pruner and score
    # variants only for surviving trials that can still win (module docstring); False: variants for every item
    multi_fidelity: bool = False
    screen_values: Callable[[pd.DataFrame], np.ndarray] | None = None
    version: int = 1  # what a study's trial values mean; bump when that changes (resume refuses other versions)
    reads_tcb: bool = False  # its values read δ_TCB: a calibrated trial then keeps hidden states to read it calibrated
    # what the incumbent's replacement test pairs (study/incumbent.py): "criterion" (the binary per-item criterion:
    # McNemar + bootstrap) or "values" (the strategy's own continuous per-item objective: Wilcoxon + bootstrap)
    replace_on: str = "criterion"

    def __post_init__(self) -> None:
        if (self.item_values is None) == (self.trial_values is None):
            raise ValueError(f"strategy {self.name!r}: give exactly one of item_values and trial_values")
        if self.replace_on not in ("criterion", "values") or (self.replace_on == "values" and self.multi_objective):
            raise ValueError(f"strategy {self.name!r}: replace_on is 'criterion', or 'values' for a single objective")
        if self.multi_fidelity and (not self.needs_variants or self.screen_values is None or self.multi_objective):
            raise ValueError(
                f"strategy {self.name!r}: multi_fidelity needs needs_variants, screen_values and item_values"
            )

    @property
    def multi_objective(self) -> bool:
        return self.trial_values is not None

    @property
    def directions(self) -> tuple[str, ...]:
        return ("maximize", "maximize") if self.multi_objective else ("maximize",)

    def values(self, table: pd.DataFrame) -> tuple[float, ...]:
        if self.multi_objective:
            return self.trial_values(table)
        return (float(self.item_values(table).mean()),)


def select_winner(strategy: Strategy, candidates: list[dict], *, tie_break: str | None = None) -> tuple[dict, str]:
    """The winning trial and a sentence saying how it was chosen (`selection_of`).

    Args:
        strategy: the search's strategy (its tie-break, unless `tie_break` is given).
        candidates: the finished trials, as dicts (number, value(s), correct, signed_stability, ...).
        tie_break: the run's `--tie-break`, which overrides the strategy's.

    Returns:
        (the winning candidate, the sentence a card records as `provenance.selection`).

    Raises:
        ValueError: no candidate.
    """
    selection = selection_of(strategy, candidates, tie_break=tie_break)
    return next(c for c in candidates if c["number"] == selection.winner.key), selection.describe()


def selection_of(strategy: Strategy, candidates: list[dict], *, tie_break: str | None = None):
    """The selection rule's decision among `candidates` (metrics/stats/selection.Selection): the tie set on dev
    correctness, broken by `tie_break` (the run's choice), else the strategy's own, else the default."""
    from promptopt.metrics.stats.selection import DEFAULT_TIE_BREAK, choose

    if not candidates:
        raise ValueError("no finished trial to choose from")
    return choose([candidate_of(c) for c in candidates], tie_break=tie_break or strategy.tie_break or DEFAULT_TIE_BREAK)


# A new strategy is one entry (its values and its winner rule): `register_strategy(Strategy(...))` in-process, or an
# entry point in the group `promptopt.strategies` naming a Strategy object (promptopt/registry.py).
STRATEGIES: Registry[Strategy] = Registry("strategy", group="promptopt.strategies")
register_strategy = STRATEGIES.register


for _strategy in (
    Strategy(name="accuracy", description="dev accuracy only", item_values=accuracy_values),
    Strategy(
        name="ppl",
        description="−NLL per token of the gold final answer (the δ_TCB paper's PPL-guided baseline)",
        item_values=answer_nll_values,
        tie_break="value",
        replace_on="values",
    ),
    Strategy(
        name="ppl_solution",
        description="−NLL per token of the whole reference target",
        item_values=solution_nll_values,
        tie_break="value",
        replace_on="values",
    ),
    Strategy(
        name="acc_ppl",
        description=f"accuracy − {LAMBDA_PPL}·NLL per token of the whole target",
        item_values=accuracy_ppl_values,
        tie_break="value",
        replace_on="values",
    ),
    Strategy(
        name="tcb",
        description="most stable prompt among those as accurate as the best (95% interval)",
        item_values=accuracy_tcb_values,
        tie_break="stability",
        reads_tcb=True,
    ),
    Strategy(
        name="acc_tcb",
        description=f"accuracy + {LAMBDA_TCB}·mean signed stability",
        item_values=accuracy_tcb_values,
        tie_break="value",
        replace_on="values",
        reads_tcb=True,
    ),
    Strategy(
        name="pareto",
        description="Pareto front of (accuracy, mean signed stability)",
        trial_values=pareto_values,
        tie_break="stability",
        reads_tcb=True,
    ),
    Strategy(
        name="robust",
        description="dev accuracy counting an item only if its cheap perturbed variants are right too "
        "(variants scored only for trials alive under the accuracy pruner that can still win)",
        item_values=robust_values,
        needs_variants=True,
        multi_fidelity=True,
        screen_values=accuracy_values,
        criterion="robust_correct",
        tie_break="value",
        version=2,
    ),
):
    register_strategy(_strategy)


def get_strategy(name: str) -> Strategy:
    strategy = STRATEGIES.get(name)
    if not isinstance(strategy, Strategy):
        raise ConfigError(f"strategy {name!r}: its entry point gives {type(strategy).__name__}, not a Strategy")
    return strategy
