"""`export --flag-rate R`: the card's fragility threshold, chosen on dev, and what it meant there.

The card's dev answers (its prompt decided by its rule; an ensemble card's members combined) are stressed under the
search suite (`cheap` unless the compare recorded another): an answer *flips* when some variant of it predicts
another answer than the clean one. For each signal (δ_TCB, margin, max probability, entropy; serving/signals.py)
τ is placed so that a share R of the dev answers falls on its fragile side, and the flip rate of flagged and of
unflagged answers is recorded with 95% Wilson intervals (answers that no family could perturb count for the share,
not for the flip rates). The flag's signal is the one whose flagged answers flip most more often than the
unflagged ones on dev (the largest gap; ties: the higher dev AUROC, then the order above) unless `--flag-signal`
names one. When no signal's flagged answers flip more often than its unflagged ones on dev (every gap ≤ 0, or no
answer flipped), the flag separates nothing there: the card records a one-line `warning` and export prints it (the
threshold is still written, for a user who flags for another reason). No test number is read to choose; where the compare kept the winner's test answers under the judging
suite, the same τ's test flip rates are recorded beside (`test`), to be read, never to choose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.errors import UserError
from promptopt.serving.signals import SIGNALS, Flag, Signal, signal, threshold_between
from promptopt.workflows.export.measure import clean

AUTO = "auto"
FLIP = (
    "some variant (a family of the suite changed the question or the prompt) predicts another answer than the clean one"
)


@dataclass(frozen=True)
class FlagRequest:
    rate: float
    signal: str = AUTO
    suite: str | None = None  # None: the compare's recorded search suite, else cheap

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and 0 < self.rate < 1):
            raise UserError(f"--flag-rate {self.rate}: expected a share of dev answers between 0 and 1 (e.g. 0.2)")
        if self.signal != AUTO:
            signal(self.signal, "--flag-signal")


def dev_answers(session, members, dev_items: list, suite) -> pd.DataFrame:
    """One row per dev answer: item_id, each signal's clean value (an ensemble's: its most fragile member's),
    n_variants and flipped (NaN where no variant was made)."""
    from promptopt.robustness.suite import Similarity, evaluate_robustness
    from promptopt.scoring.calibration import DecidingScorer

    scorer, generative = session.scorer, session.data.spec.answer.generative
    similarity, names = Similarity(), [f.name for f in suite.families]
    tables = []
    for member in members:
        rob = evaluate_robustness(
            scorer if generative else DecidingScorer(scorer, member.rule),
            member.prompt,
            dev_items,
            suite,
            pool=session.data.pool,
            similarity=similarity,
            paraphrases=session.paraphrases,
            seen=names,
        )
        tables.append(rob.items)
    if len(tables) == 1:
        items = tables[0]
    else:
        from promptopt.workflows.ensemble import ensemble_items

        items = ensemble_items(tables)
    out = _flips(items).set_index("item_id").reindex([i.id for i in dev_items])
    for s in SIGNALS:
        per_member = [t[t["family"].isna()].set_index("item_id")[f"clean_{s.name}"] for t in tables]
        out[s.name] = [s.combine([float(m.get(i, np.nan)) for m in per_member]) for i in out.index]
    return out.reset_index()


def _flips(items: pd.DataFrame) -> pd.DataFrame:
    """item_id, n_variants and flipped for every clean answer of an ITEM_COLUMNS table."""
    ids = items.loc[items["family"].isna(), "item_id"]
    variants = items[items["family"].notna()]
    changed = variants["perturbed_prediction"].astype(str) != variants["clean_prediction"].astype(str)
    per = changed.groupby(variants["item_id"]).agg(["size", "any"])
    out = pd.DataFrame({"item_id": ids.to_numpy()})
    out["n_variants"] = out["item_id"].map(per["size"]).fillna(0).astype(int)
    out["flipped"] = out["item_id"].map(per["any"]).astype("boolean")
    return out


def place_threshold(values, sig: Signal, rate: float) -> float:
    """τ with a share `rate` of `values` on its fragile side: between the k-th and (k+1)-th most fragile value,
    k = round(rate · n) (at least 1, at most n − 1)."""
    finite = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(values)
    if n < 2:
        raise UserError(f"--flag-rate: {n} dev answer(s): a threshold needs at least 2")
    k = min(max(1, round(rate * n)), n - 1)
    ranked = sorted(finite, key=sig.fragility, reverse=True)
    missing = n - len(finite)  # answers without a value are flagged anyway and rank first
    if k <= missing:
        raise UserError(f"--flag-rate {rate}: {missing} dev answers have no {sig.label}; flag a larger share")
    fragile, steady = ranked[k - missing - 1], ranked[k - missing]
    tau = threshold_between(float(fragile), float(steady), sig.name)
    if not math.isfinite(tau):
        raise UserError(f"--flag-rate {rate}: no finite {sig.label} threshold flags that share; flag a smaller one")
    return tau


def _rates(flagged: np.ndarray, flipped: pd.Series) -> dict:
    from promptopt.metrics.stats import wilson_interval

    known = flipped.notna().to_numpy()
    flips = flipped.fillna(False).astype(bool).to_numpy()
    out = {}
    for name, side in (("flagged", flagged), ("unflagged", ~flagged)):
        n, k = int((side & known).sum()), int((side & known & flips).sum())
        out[name] = {
            "n": n,
            "flipped": k,
            "flip_rate": k / n if n else None,
            "flip_rate_ci95": list(wilson_interval(k, n)),
        }
    return out


def signal_stats(answers: pd.DataFrame, sig: Signal, tau: float) -> dict:
    """What flagging by `sig` at τ means on these answers: the share flagged, flip rates with intervals, the gap."""
    from promptopt.metrics.stats import auroc

    values = answers[sig.name].to_numpy(dtype=float)
    flag = Flag(sig, tau)
    flagged = np.array([flag(float(v)) for v in values], dtype=bool)
    rates = _rates(flagged, answers["flipped"])
    a, b = rates["flagged"]["flip_rate"], rates["unflagged"]["flip_rate"]
    known = answers["flipped"].notna().to_numpy()
    scores = np.array([sig.fragility(float(v)) for v in values])
    finite = scores[np.isfinite(scores)]
    if len(finite):  # infinities kept in order just beyond the finite scores (auroc drops non-finite ones)
        scores = np.clip(scores, finite.min() - 1, finite.max() + 1)
    labels = answers["flipped"].fillna(False).astype(bool).to_numpy()
    return {
        "direction": sig.direction,
        "threshold": tau,
        "flagged_share": float(flagged.mean()),
        **rates,
        "gap": None if a is None or b is None else a - b,
        "auroc": _finite(auroc(scores[known], labels[known])) if known.any() else None,
    }


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def fragility_section(session, members, dev_items: list, request: FlagRequest, *, suite, test=None) -> dict:
    """The card's `fragility` section (module docstring); `test`: the compare's test answers of this card
    (ITEM_COLUMNS rows of one strategy and seed) to record the chosen τ's test flip rates beside."""
    from promptopt.robustness.suite import suite_sha256

    answers = dev_answers(session, members, dev_items, suite)
    if not (answers["n_variants"] > 0).any():
        raise UserError(f"--flag-rate: suite {suite.name} made no variant of any of the {len(answers)} dev answers")
    stats = {
        s.name: signal_stats(answers, s, place_threshold(answers[s.name].tolist(), s, request.rate)) for s in SIGNALS
    }
    if request.signal != AUTO:
        chosen = request.signal
        why = f"named with --flag-signal {chosen}"
    elif not answers["flipped"].fillna(False).any():
        chosen = SIGNALS[0].name
        why = f"no dev answer flipped under suite {suite.name}, so no signal can be told apart on dev: δ_TCB by default"
    else:
        order = {s.name: i for i, s in enumerate(SIGNALS)}

        def key(name):  # the largest gap (none: below every measured one), then the higher AUROC, then the order
            gap = stats[name]["gap"]
            return (-(-2.0 if gap is None else gap), -(stats[name]["auroc"] or 0.0), order[name])

        chosen = min(stats, key=key)
        gaps = ", ".join(f"{BY_LABEL[name]} {_pct(stats[name]['gap'])}" for name in stats)
        why = (
            f"the largest dev flip-rate gap (flagged − unflagged) at a {request.rate:.0%} flag rate under suite "
            f"{suite.name}: {gaps}; no test number was read"
        )
    warning = _no_separation(stats, chosen, request.rate, suite.name)
    section = {
        "signal": chosen,
        "direction": stats[chosen]["direction"],
        "threshold": stats[chosen]["threshold"],
        "flag_rate": request.rate,
        "chosen_by": why,
        "dev": {
            "n": len(answers),
            "n_with_variants": int((answers["n_variants"] > 0).sum()),
            "suite": suite.name,
            "suite_sha256": suite_sha256(suite),
            "flip": FLIP,
            "basis": "each signal read on the clean answer at the critical point, on the distribution the card's "
            "decision reads" + ("; an ensemble's is its most fragile member's" if len(members) > 1 else ""),
        },
        "signals": stats,
    }
    if warning:
        section["warning"] = warning
    if test is not None and len(test):
        section["test"] = check_on_test(test, section)
    return clean(section)


def _no_separation(stats: dict, chosen: str, rate: float, suite: str) -> str | None:
    """The card's one-line warning when no signal separates flips on dev (None when the chosen one does): its
    flagged answers flip no more often than the unflagged ones, and no other signal's do either."""
    gaps = {name: s["gap"] for name, s in stats.items()}
    if gaps[chosen] is not None and gaps[chosen] > 0:
        return None
    if any(g is not None and g > 0 for g in gaps.values()):
        best = max((n for n in gaps if gaps[n] is not None), key=lambda n: gaps[n])
        return (
            f"the flag's signal {BY_LABEL[chosen]} does not separate flips on dev (gap {_pct(gaps[chosen])} at a "
            f"{rate:.0%} flag rate under suite {suite}); {BY_LABEL[best]} does ({_pct(gaps[best])})"
        )
    side = stats[chosen]
    rates = f"{_pct(side['flagged']['flip_rate'], sign=False)} vs {_pct(side['unflagged']['flip_rate'], sign=False)}"
    return (
        f"no signal separates flips on dev: at a {rate:.0%} flag rate under suite {suite} every signal's flagged "
        f"answers flip no more often than its unflagged ones ({BY_LABEL[chosen]}: {rates} flagged vs unflagged); "
        "a flag here marks answers no more fragile than the rest"
    )


def check_on_test(items: pd.DataFrame, section: dict) -> dict:
    """The card's τ on the compare's test answers under the families no search saw: flip rates with intervals, and
    whether the dev flip rates sit inside them."""
    sig = signal(section["signal"])
    unseen = items[items["family"].isna() | (items["seen"].astype("boolean") == False)]  # noqa: E712
    answers = _flips(unseen)
    clean_rows = items[items["family"].isna()].set_index("item_id")
    answers[sig.name] = answers["item_id"].map(clean_rows[f"clean_{sig.name}"]).astype(float)
    stats = signal_stats(answers, sig, section["threshold"])
    inside = {}
    for side in ("flagged", "unflagged"):
        dev_rate, (low, high) = section["signals"][sig.name][side]["flip_rate"], stats[side]["flip_rate_ci95"]
        inside[side] = None if dev_rate is None or stats[side]["n"] == 0 else bool(low <= dev_rate <= high)
    return {
        "n": len(answers),
        "n_with_variants": int((answers["n_variants"] > 0).sum()),
        "suite": "the compare's judging suite, families no search saw",
        "flagged_share": stats["flagged_share"],
        "flagged": stats["flagged"],
        "unflagged": stats["unflagged"],
        "dev_flip_rate_inside": inside,
        "note": "measured after the choice, never used to make it",
    }


def compare_test_items(run) -> pd.DataFrame | None:
    """The exported winner's test answers under the judging suite, from its compare's robustness_items.parquet."""
    row = run.compare_row
    path = Path(run.cache_dir) / "robustness_items.parquet"
    if not row or not path.is_file():
        return None
    items = pd.read_parquet(path)
    if "strategy" not in items:
        return None
    mine = items[(items["strategy"] == row["strategy"]) & (items["seed"].astype(int) == int(row.get("seed") or 0))]
    return mine if len(mine) else None


def answers_match(items: pd.DataFrame | None, table: pd.DataFrame) -> bool:
    """Whether the compare's clean test answers are this card's (its measured test table): the same prediction and,
    where both keep them, the same decision scores on every item both have. Guards the test check against a row of
    the compare that belongs to another prompt (e.g. a trial `--select robust` chose that compare did not)."""
    if items is None or not len(items):
        return False
    clean = items[items["family"].isna()].drop_duplicates("item_id").set_index("item_id")
    mine = table.set_index("item_id")
    shared = [i for i in clean.index if i in mine.index]
    if not shared:
        return False
    if (clean.loc[shared, "clean_prediction"].astype(str) != mine.loc[shared, "pred"].astype(str)).any():
        return False
    if "clean_scores" in clean and "decision_scores" in mine:
        for i in shared:
            a, b = clean.at[i, "clean_scores"], mine.at[i, "decision_scores"]
            if a is not None and b is not None and not np.allclose(list(a), list(b), atol=1e-3):
                return False
    return True


BY_LABEL = {s.name: s.label for s in SIGNALS}


def _pct(value, sign: bool = True) -> str:
    return "n/a" if value is None else f"{value:+.1%}" if sign else f"{value:.1%}"


__all__ = [
    "AUTO",
    "FlagRequest",
    "answers_match",
    "compare_test_items",
    "dev_answers",
    "fragility_section",
    "place_threshold",
]
