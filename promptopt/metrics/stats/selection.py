"""Choosing among candidate prompts on dev, knowing the noise: the one rule every place that picks a winner uses
(a search strategy's winner, compare's `--select`, export's card, `export --select robust`).

The rule (`choose`):
1. **Tie set.** The best candidate is the one with the highest dev accuracy (earlier `order` first on equal
   accuracy). Every other candidate is compared with it on the same dev items, paired: the exact McNemar test on the
   per-item correctness and the 95% paired bootstrap interval of the accuracy difference (seeded item resamples,
   `bootstrap_draws`). A candidate is *significantly worse* only when both say so (McNemar p < `alpha` and the
   interval's upper end below 0), the project's rule for a claim of "better"; every candidate not significantly
   worse ties with the best. No correction for the number of comparisons: one would only widen the tie set, and the
   best's own accuracy is already the maximum of several noisy ones (it flatters the best, so ties are, if
   anything, undercounted).
2. **Tie-break.** A named rule chooses within the tie set (`TIE_BREAKS`); remaining ties go to the higher dev
   accuracy, then to the earlier `order`. A tie set of one is the best candidate itself: a clear winner is chosen
   whatever the tie-break says.

Only dev numbers enter: a candidate carries its dev answers and dev-side attributes, nothing else, so a test
number cannot change a choice. `minimum_detectable_effect` says how large an accuracy difference the dev size can
detect (paired, 80% power), so a run can say when its dev set is too small to choose.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from promptopt.errors import ConfigError

ALPHA = 0.05
POWER = 0.8
N_BOOT = 2000

# name -> what it prefers (the sentence a card records). Higher is better except for cost.
TIE_BREAKS = {
    "stability": "the higher mean signed stability on dev (δ_TCB read on the distribution the decision reads)",
    "cost": "the cheaper card (fewer prompt characters the model reads per input)",
    "calibrated": "a calibrated or ensembled candidate before a plain argmax one (then the higher stability)",
    "argmax": "a plain argmax candidate before a calibrated or ensembled one (then the higher stability)",
    "robust": "the higher dev Acc_worst under the search suite",
    "value": "the higher value of the strategy's own objective on dev",
}
DEFAULT_TIE_BREAK = "stability"
# `export`'s choice among a compare's winners, which may decide by different rules: on dev, a tie set's calibrated
# candidate was the less robust one under unseen families in 65 of 76 decided pairs (SST-2, docs/lab/strategies.md
# #selection-on-dev), and the cards shipped by stability alone were less robust than accuracy+argmax on SciQ
# (docs/lab/strategies.md#issue-51-experiment)
EXPORT_TIE_BREAK = "argmax"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One candidate as the rule sees it: its answers on the dev items (correct or not, the same items in the same
    order for every candidate) and the dev-side numbers a tie-break may read. NaN: not measured (a tie-break then
    ranks it last)."""

    key: object  # what the caller knows it by (a trial number, a row)
    correct: Sequence[bool]
    order: int = 0  # the caller's order: earlier wins a full tie
    stability: float = math.nan
    cost: float = math.nan
    calibrated: bool = False
    robust: float = math.nan
    value: float = math.nan
    label: str = ""  # how the record names it (default: its key)

    @property
    def accuracy(self) -> float:
        return sum(bool(c) for c in self.correct) / len(self.correct) if len(self.correct) else math.nan

    @property
    def name(self) -> str:
        return self.label or str(self.key)


@dataclass(frozen=True)
class Paired:
    """A candidate against the best on the same dev items: difference in accuracy (candidate − best), its 95%
    paired bootstrap interval, the exact McNemar counts and p-value, and whether it is significantly worse."""

    diff: float
    interval: tuple[float, float]
    only_candidate: int
    only_best: int
    p: float
    worse: bool


@dataclass(frozen=True)
class Selection:
    """What `choose` decided, with everything a card or a run records about it."""

    winner: Candidate
    best: Candidate
    tie_set: tuple[Candidate, ...]
    paired: dict  # candidate name -> Paired (every candidate but the best)
    tie_break: str
    alpha: float
    n_items: int
    n_candidates: int
    mde: float  # the smallest accuracy difference the dev size detects (80% power), at `discordance`
    discordance: float

    def describe(self) -> str:
        """One sentence: the tie set, why the winner won, and what the dev size can tell apart."""
        w, b = self.winner, self.best
        if len(self.tie_set) == 1:
            why = f"a clear winner: every other of the {self.n_candidates} candidates is significantly worse"
            if self.n_candidates == 1:
                why = "the only candidate"
            if _measured(_attribute(w, self.tie_break)):
                why += _attribute_text(w, self.tie_break)
        else:
            why = (
                f"{len(self.tie_set)} of {self.n_candidates} candidates tie with the best ({b.name}, dev accuracy "
                f"{b.accuracy:.3f}; not significantly worse, paired: exact McNemar p ≥ {self.alpha:g} or the 95% "
                f"bootstrap interval reaching 0): {', '.join(c.name for c in self.tie_set)}; tie-break "
                f"'{self.tie_break}' ({TIE_BREAKS[self.tie_break]}) chose {w.name}{_attribute_text(w, self.tie_break)}"
            )
        return (
            f"{w.name} (dev accuracy {w.accuracy:.3f} on {self.n_items} items): {why}; the smallest difference "
            f"{self.n_items} dev items detect is {_mde_text(self.mde)} (80% power, discordant rate "
            f"{self.discordance:.2f}); no test number was read"
        )

    def record(self) -> dict:
        """A plain dict for a card's provenance or a run's summary (JSON/YAML-safe)."""

        def entry(c: Candidate) -> dict:
            row = {"candidate": _plain(c.key), "dev_accuracy": round(c.accuracy, 6)}
            attr = _attribute(c, self.tie_break)
            if attr is not None and not (isinstance(attr, float) and math.isnan(attr)):
                row[self.tie_break] = _plain(attr)
            p = self.paired.get(c.name)
            if p is not None:
                row.update(
                    diff=round(p.diff, 6),
                    ci95=[round(p.interval[0], 6), round(p.interval[1], 6)],
                    mcnemar_p=round(p.p, 6),
                )
            return row

        return {
            "rule": "tie set: not significantly worse than the best on the same dev items (exact McNemar and 95% "
            "paired bootstrap, both); then the tie-break; then dev accuracy, then the earlier candidate",
            "tie_break": self.tie_break,
            "tie_break_means": TIE_BREAKS[self.tie_break],
            "alpha": self.alpha,
            "n_dev_items": self.n_items,
            "n_candidates": self.n_candidates,
            "best": _plain(self.best.key),
            "winner": _plain(self.winner.key),
            "tie_set": [entry(c) for c in self.tie_set],
            "why": self.describe(),
            "mde": None if math.isnan(self.mde) else round(self.mde, 6),
            "discordance": round(self.discordance, 6),
        }


def encode_answers(correct) -> str:
    """Per-item correctness as text, one character an item: "+" right, "-" wrong (what a trial's `dev_correct` and a
    compare_runs.csv row carry; not digits, so no table reader takes it for a number)."""
    return "".join("+" if c else "-" for c in correct)


def decode_answers(text) -> list[bool] | None:
    """`encode_answers` undone; None for anything else (a missing value, a number a reader made of it)."""
    if not isinstance(text, str) or not text or text.strip("+-"):
        return None
    return [c == "+" for c in text]


def check_tie_break(name: str) -> str:
    if name not in TIE_BREAKS:
        raise ConfigError(f"tie-break: unknown tie-break {name!r} (use one of {', '.join(TIE_BREAKS)})")
    return name


def choose(
    candidates: Sequence[Candidate],
    *,
    tie_break: str = DEFAULT_TIE_BREAK,
    alpha: float = ALPHA,
    seed: int = 0,
    n_boot: int = N_BOOT,
    fill: Callable[[list[Candidate]], list[Candidate]] | None = None,
) -> Selection:
    """The winner among `candidates` (module docstring). `fill`, when given, is called with the tie set only (a clear
    winner alone) and returns it with a tie-break's attribute measured (e.g. `robust`, which costs a stress run per
    candidate)."""
    check_tie_break(tie_break)
    candidates = list(candidates)
    if not candidates:
        raise ValueError("no candidate to choose from")
    n = len(candidates[0].correct)
    if n == 0 or any(len(c.correct) != n for c in candidates):
        raise ValueError(
            f"every candidate needs its answers on the same dev items: lengths {[len(c.correct) for c in candidates]}"
        )
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidate names repeat: {names}")
    best = max(candidates, key=lambda c: (c.accuracy, -c.order))
    others = [c for c in candidates if c is not best]
    paired = dict(zip([c.name for c in others], compare_with_best(best, others, alpha=alpha, seed=seed, n_boot=n_boot)))
    tied = [best] + [c for c in others if not paired[c.name].worse]
    if fill is not None:  # measured for the winner too when it is clear: the record says what it was
        tied = list(fill(tied))
    winner = max(tied, key=lambda c: (_key(c, tie_break), c.accuracy, -c.order))
    rate = discordance(best, others)
    return Selection(
        winner=winner,
        best=next(c for c in tied if c.name == best.name),
        tie_set=tuple(sorted(tied, key=lambda c: c.order)),
        paired=paired,
        tie_break=tie_break,
        alpha=alpha,
        n_items=n,
        n_candidates=len(candidates),
        mde=minimum_detectable_effect(n, rate, alpha=alpha),
        discordance=rate,
    )


def compare_with_best(
    best: Candidate, others: Sequence[Candidate], *, alpha=ALPHA, seed=0, n_boot=N_BOOT
) -> list[Paired]:
    """Each of `others` against `best` on the same items (exact McNemar; paired bootstrap of the accuracy
    difference, every candidate read on the same seeded resamples)."""
    import numpy as np

    from promptopt.metrics.stats.binomial import mcnemar_exact
    from promptopt.metrics.stats.bootstrap import bootstrap_draws, percentile_interval

    if not others:
        return []
    b = np.asarray(best.correct, dtype=bool)
    n = len(b)
    diffs = np.array([np.asarray(c.correct, dtype=float) - b for c in others]).T  # (items, candidates)
    resampled = bootstrap_draws(n, n_boot=n_boot, seed=seed) @ diffs / n  # (resamples, candidates)
    out = []
    for j, c in enumerate(others):
        only_c, only_b, p = mcnemar_exact(c.correct, b)
        low, high = percentile_interval(resampled[:, j])
        diff = float(diffs[:, j].mean())
        out.append(Paired(diff, (low, high), only_c, only_b, p, bool(p < alpha and high < 0)))
    return out


def discordance(best: Candidate, others: Sequence[Candidate]) -> float:
    """The median share of dev items on which a candidate and the best disagree in correctness (the discordant-pair
    rate a paired test's power depends on); NaN with no other candidate."""
    import numpy as np

    if not others:
        return math.nan
    b = np.asarray(best.correct, dtype=bool)
    return float(np.median([np.mean(np.asarray(c.correct, dtype=bool) != b) for c in others]))


def minimum_detectable_effect(n: int, discordant_rate: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest accuracy difference a paired test on `n` items detects with `power` at two-sided level `alpha`,
    when a share `discordant_rate` of the items is answered right by one prompt only (McNemar's normal form:
    Δ = (z_{1−α/2} + z_power)·√(d / n), d the discordant rate; the variance of a per-item difference is d − Δ²,
    taken as d, so the value is slightly conservative). NaN when d is unknown; 0 discordance means any difference
    would be seen, and none was."""
    from scipy.stats import norm

    if n <= 0 or not math.isfinite(discordant_rate):
        return math.nan
    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return float(z * math.sqrt(discordant_rate / n))


def dev_items_for(effect: float, discordant_rate: float, *, alpha: float = ALPHA, power: float = POWER) -> int:
    """The dev size at which `minimum_detectable_effect` reaches `effect` (the inverse, rounded up)."""
    from scipy.stats import norm

    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return math.ceil((z / effect) ** 2 * discordant_rate - 1e-9)  # the float round trip must not add an item


# --- tie-break keys: higher is preferred --------------------------------------------------------------------------
def _finite(value: float, *, lower_is_better: bool = False) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return -math.inf
    return -float(value) if lower_is_better else float(value)


def _key(c: Candidate, tie_break: str) -> tuple:
    if tie_break == "cost":
        return (_finite(c.cost, lower_is_better=True),)
    if tie_break == "calibrated":
        return (bool(c.calibrated), _finite(c.stability))
    if tie_break == "argmax":
        return (not c.calibrated, _finite(c.stability))
    return (_finite(getattr(c, tie_break)),)


def _attribute(c: Candidate, tie_break: str):
    return c.calibrated if tie_break in ("calibrated", "argmax") else getattr(c, tie_break)


def _measured(value) -> bool:
    return isinstance(value, bool) or not (value is None or (isinstance(value, float) and math.isnan(value)))


def _attribute_text(c: Candidate, tie_break: str) -> str:
    value = _attribute(c, tie_break)
    if isinstance(value, bool):
        return f" ({'calibrated or ensembled' if value else 'argmax'})"
    if isinstance(value, float) and math.isnan(value):
        return f" (its {tie_break} not measured: by dev accuracy, then order)"
    return f" ({tie_break} {value:.3f})" if isinstance(value, float) else f" ({tie_break} {value})"


MIN_DEV_ITEMS = 2  # below: no two candidates can be told apart on dev at all, and a search is refused
ASSUMED_DISCORDANCE = 0.2  # before any trial: the share of items one prompt gets right and the other wrong
WARN_EFFECT = 0.2  # a dev set whose paired test cannot see a 20-point accuracy difference is warned of


def dev_size_warning(n_dev: int, *, flag: str | None = "--dev-limit") -> str | None:
    """One line when `n_dev` dev items are too few to choose a winner (None when enough): the smallest accuracy
    difference their paired test detects (80% power, 5% level) if a fifth of the items are discordant, which no
    run knows before its trials (the search's own line says it after, from the trials' answers). Below
    `MIN_DEV_ITEMS` nothing can be chosen at all: a ValueError (its caller's error line)."""
    if n_dev < MIN_DEV_ITEMS:
        raise ValueError(
            f"{n_dev} dev item{'' if n_dev == 1 else 's'}: a search needs at least {MIN_DEV_ITEMS} to tell prompts apart"
        )
    mde = minimum_detectable_effect(n_dev, ASSUMED_DISCORDANCE)
    if mde <= WARN_EFFECT:
        return None
    enough = dev_items_for(WARN_EFFECT, ASSUMED_DISCORDANCE)
    return (
        f"{n_dev} dev items choose the winner: their paired test detects only accuracy differences of "
        f"{min(mde, 1.0):.3f} or more (80% power, a fifth of items discordant); a winner chosen on them is mostly "
        f"chance ({f'raise {flag}: ' if flag else ''}{enough} items detect {WARN_EFFECT:.2f})"
    )


def _mde_text(mde: float) -> str:
    return "unknown (one candidate)" if math.isnan(mde) else f"{mde:.3f}"


def _plain(value):
    """JSON/YAML-safe: numpy scalars become Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict, str)):
        return value.item()
    return value


__all__ = [
    "ALPHA",
    "DEFAULT_TIE_BREAK",
    "EXPORT_TIE_BREAK",
    "TIE_BREAKS",
    "Candidate",
    "Paired",
    "Selection",
    "check_tie_break",
    "choose",
    "compare_with_best",
    "decode_answers",
    "dev_items_for",
    "dev_size_warning",
    "discordance",
    "encode_answers",
    "minimum_detectable_effect",
]
