"""Racing on dev: a trial is scored on growing slices of the dev items and dropped as soon as a paired test says it
is behind, so a contender sees all of dev and a hopeless candidate a first slice (F-race / irace, as an Optuna
pruner).

A trial reports one value per dev item (study/trial.py). At the end of each slice (`slice_ends`: the first
minibatch, then doubling) `RacingPruner` compares it, on the items it has seen, with two references:

1. **The leader** (F-race's rule): the best finished trial, the incumbent included. Binary values (correct or not)
   by the exact one-sided sign test on the discordant items (McNemar's exact test, one tail), continuous values by
   the one-sided Wilcoxon signed-rank test; the trial is dropped when p < `alpha` (0.1, Optuna's WilcoxonPruner's
   default threshold). Like irace's tests, each look is uncorrected: a wrongly dropped candidate only costs what it
   might have found, never the incumbent's guarantee.
2. **The incumbent, for futility** (binary values only): a candidate is shipped only if it beats the incumbent on
   every dev item by the replacement test (study/incumbent.py). Even if every item still to come went its way
   (right where the incumbent is wrong, and right where it is right), it needs the exact McNemar p < `alpha_final`
   with more items right only with it than only with the incumbent; when even that best case fails, no outcome of the
   remaining items can make it ship, and it is dropped. This rule never drops a candidate that could have shipped.

A multi-fidelity strategy (`robust`) reports clean correctness, an upper bound of its value: only the leader rule
applies to it (its replacement is decided on robust correctness, which the clean values do not bound from below).
"""

from __future__ import annotations

from dataclasses import dataclass

ALPHA_RACE = 0.1
ALPHA_FINAL = 0.05


def slice_ends(n_items: int, first: int) -> list[int]:
    """Where the slices of `n_items` dev items end: `first`, then doubling, then every item."""
    ends, end = [], max(1, first)
    while end < n_items:
        ends.append(end)
        end *= 2
    return ends + [n_items]


@dataclass(frozen=True)
class Verdict:
    drop: bool
    reason: str = ""  # one line: which rule, against which trial, with the numbers


def _one_sided_sign_p(behind: int, ahead: int) -> float:
    """P(X ≤ ahead) for X ~ Binomial(behind + ahead, 1/2): how likely a trial as good as its reference would be this
    far behind on the discordant items."""
    from scipy.stats import binom

    n = behind + ahead
    return 1.0 if n == 0 else float(binom.cdf(ahead, n, 0.5))


def _binary(values) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def versus_leader(mine: list[float], leader: list[float], *, leader_name: str, alpha: float = ALPHA_RACE) -> Verdict:
    """Rule 1: drop when the trial is significantly behind the leader on the items both have (one-sided)."""
    import numpy as np

    n = min(len(mine), len(leader))
    a, b = np.asarray(mine[:n], dtype=float), np.asarray(leader[:n], dtype=float)
    if _binary(a) and _binary(b):
        ahead, behind = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
        p = _one_sided_sign_p(behind, ahead)
        numbers = f"{ahead} items right only here, {behind} only with {leader_name}"
    else:
        from scipy.stats import wilcoxon

        d = a - b
        p = 1.0 if not np.any(d) else float(wilcoxon(a, b, alternative="less").pvalue)
        numbers = f"mean per-item difference {d.mean():+.3f}"
    if p < alpha:
        return Verdict(
            True,
            f"behind the leader {leader_name} on the first {n} dev items ({numbers}; one-sided p = {p:.3g} < {alpha:g})",
        )
    return Verdict(False)


def versus_incumbent(
    mine: list[float], incumbent: list[float], *, incumbent_name: str, alpha: float = ALPHA_FINAL
) -> Verdict:
    """Rule 2 (binary values): drop when no outcome of the remaining dev items lets the trial beat the incumbent."""
    from promptopt.metrics.stats.binomial import mcnemar_exact

    n = len(mine)
    seen = [bool(v) for v in mine]
    rest = [not bool(v) for v in incumbent[n:]]  # the best case: right on every remaining item
    best_case = seen + [True] * (len(incumbent) - n)
    only_mine, only_incumbent, p = mcnemar_exact(best_case, [bool(v) for v in incumbent])
    if only_mine > only_incumbent and p < alpha:
        return Verdict(False)
    return Verdict(
        True,
        f"cannot beat {incumbent_name}: even right on all {len(incumbent) - n} remaining dev items "
        f"({sum(rest)} of which {incumbent_name} gets wrong) it would lead {only_mine} to {only_incumbent} "
        f"discordant items, exact McNemar p = {p:.3g} (needs < {alpha:g})",
    )


def race(
    mine: list[float],
    *,
    leader: tuple[str, list[float]] | None,
    incumbent: tuple[str, list[float]] | None,
    futility: bool,
    alpha: float = ALPHA_RACE,
    alpha_final: float = ALPHA_FINAL,
) -> Verdict:
    """Both rules at one look (module docstring); the leader's first."""
    if leader is not None:
        verdict = versus_leader(mine, leader[1], leader_name=leader[0], alpha=alpha)
        if verdict.drop:
            return verdict
    if futility and incumbent is not None and _binary(mine) and _binary(incumbent[1]):
        return versus_incumbent(mine, incumbent[1], incumbent_name=incumbent[0], alpha=alpha_final)
    return Verdict(False)


def _values(trial) -> list[float]:
    steps = trial.intermediate_values
    return [steps[i] for i in range(len(steps)) if i in steps]


def _make_pruner():
    from optuna.pruners import BasePruner

    class RacingPruner(BasePruner):
        """Optuna's face of `race`: decides at the end of each slice of `n_items` dev items (`slice_ends`); the
        reason of the last drop of each trial is kept in `reasons` (trial number -> line) for the run's record."""

        def __init__(
            self,
            *,
            n_items: int,
            first: int,
            futility: bool,
            alpha: float = ALPHA_RACE,
            alpha_final: float = ALPHA_FINAL,
        ) -> None:
            self.ends = set(slice_ends(n_items, first))
            self.n_items, self.futility = n_items, futility
            self.alpha, self.alpha_final = alpha, alpha_final
            self.reasons: dict[int, str] = {}

        def prune(self, study, trial) -> bool:
            from optuna.trial import TrialState

            from promptopt.study.incumbent import is_incumbent

            mine = _values(trial)
            if len(mine) not in self.ends or len(mine) >= self.n_items:
                return False
            finished = [
                t
                for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.number != trial.number and len(t.intermediate_values) >= len(mine) and t.value is not None
            ]
            leader = max(finished, key=lambda t: (t.value, -t.number), default=None)
            incumbent = next((t for t in finished if is_incumbent(t)), None)
            verdict = race(
                mine,
                leader=None if leader is None else (_name(leader), _values(leader)),
                incumbent=None if incumbent is None else (_name(incumbent), _values(incumbent)),
                futility=self.futility and incumbent is not None and len(_values(incumbent)) == self.n_items,
                alpha=self.alpha,
                alpha_final=self.alpha_final,
            )
            if verdict.drop:
                self.reasons[trial.number] = verdict.reason
            return verdict.drop

    return RacingPruner


def _name(trial) -> str:
    from promptopt.study.incumbent import is_incumbent

    return "the incumbent" if is_incumbent(trial) else f"trial {trial.number}"


def racing_pruner(*, n_items: int, first: int, futility: bool):
    """A RacingPruner (an optuna BasePruner) for `n_items` dev items, first slice `first`."""
    return _make_pruner()(n_items=n_items, first=first, futility=futility)


__all__ = [
    "ALPHA_FINAL",
    "ALPHA_RACE",
    "Verdict",
    "race",
    "racing_pruner",
    "slice_ends",
    "versus_incumbent",
    "versus_leader",
]
