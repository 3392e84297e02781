"""What compare hands export and the report, as types: `RunRow`, one row of compare_runs.csv (an evaluated candidate:
what export chooses from and records on a card), and the names of the columns compare.csv and compare_paired.csv
share with it. A column is spelled here only; compare writes and its readers read through these names, so renaming
one is one edit and a reader cannot ask for a column compare never writes.

Every number comes with its 95% interval in two columns (`interval_columns(key)`), and over several seeds with its sd
(`sd_column(key)`). A leaf: it imports nothing of promptopt."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

ACCURACY = "avg_acc"  # test accuracy (compare.csv: mean over seeds)
ACCURACY_CI = ("acc_ci_low", "acc_ci_high")  # its Wilson 95% interval (Table 3 of the diagnosis writes the same)
DELTA_ACCURACY = "delta_acc"  # compare_paired.csv: accuracy of a − accuracy of b on the same items
TCB_MEAN, TCB_GEOMEAN, TCB_MEDIAN = "avg_tcb", "tcb_geomean", "tcb_median"
PPL_MEAN = "avg_ppl"
SELECTED_BY = "selected_by"  # how the search's winner was chosen
SEARCH_SECONDS = "search_seconds"  # compare.csv: the strategy's searches' wall time (NaN: baseline, ensembles)

# compare_runs.csv: identity, the test headline and where it came from (RunRow's fields, in the file's order)
_HEAD = ("strategy", "seed", "rank", "winner", "n_test", ACCURACY, *ACCURACY_CI)
_TEST = (TCB_MEAN, TCB_GEOMEAN, TCB_MEDIAN, PPL_MEAN, SELECTED_BY)
# the dev side export selects on (never a test column), per kind of row: the baseline is no search's trial, an
# ensemble has members and no per-item dev answers of its own
_SEARCHED = ("trial", "dev_accuracy", "dev_correct", "dev_signed_stability", "cost", "card")
_ENSEMBLE = ("trial", "dev_accuracy", "card", "members")
_BASELINE = ("card",)
EXPORT_COLUMNS = frozenset({"strategy", "seed", "rank", "winner", "trial", "dev_accuracy", "dev_correct"})


def interval_columns(key: str) -> tuple[str, str]:
    """The two columns of `key`'s 95% interval (accuracy's keeps its historical `acc_ci_*` names)."""
    return ACCURACY_CI if key == ACCURACY else (f"{key}_ci_low", f"{key}_ci_high")


def sd_column(key: str) -> str:
    """The column of `key`'s sd across seeds (compare.csv)."""
    return f"{key}_sd"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


@dataclass
class RunRow:
    """One evaluated candidate of a compare (compare_runs.csv): a search's top-N trial, an ensemble, or the
    baseline. `robustness` holds every robustness column (over all judged families, the unseen and the seen ones,
    with their intervals) by its name, as compare measured it; NaN where compare had no suite."""

    strategy: str
    seed: int
    rank: int
    winner: bool
    n_test: int
    accuracy: float
    accuracy_ci: tuple[float, float]
    tcb_mean: float
    tcb_geomean: float
    tcb_median: float
    ppl_mean: float
    selected_by: str
    robustness: dict = field(default_factory=dict)
    trial: int | None = None
    dev_accuracy: float | None = None
    dev_correct: str | None = None  # per-item dev answers (metrics/stats/selection.py encode_answers)
    dev_signed_stability: float | None = None
    cost: float | None = None
    card: str = ""
    members: list | None = None  # an ensemble's member trials

    @property
    def kind(self) -> str:
        if self.strategy == "baseline":
            return "baseline"
        return "ensemble" if self.members is not None else "searched"

    def columns(self) -> dict:
        """The row as compare writes it, in the file's column order."""
        head = (self.strategy, self.seed, self.rank, self.winner, self.n_test, self.accuracy, *self.accuracy_ci)
        test = (self.tcb_mean, self.tcb_geomean, self.tcb_median, self.ppl_mean, self.selected_by)
        out = {**dict(zip(_HEAD, head)), **dict(zip(_TEST, test)), **self.robustness}
        tail = {"baseline": _BASELINE, "ensemble": _ENSEMBLE, "searched": _SEARCHED}[self.kind]
        out.update({name: getattr(self, name) for name in tail})
        return out

    @classmethod
    def from_columns(cls, row: Mapping) -> RunRow:
        """A row read back (a pandas row of compare_runs.csv, or a dict). Identity (strategy, seed) must be there;
        a missing, NaN or unreadable optional field is None, a missing number NaN (a run folder is someone else's)."""
        get = row.get
        known = {*_HEAD, *_TEST, *_SEARCHED, *_ENSEMBLE}
        trial = _number(get("trial"))
        return cls(
            strategy=str(row["strategy"]),
            seed=int(row["seed"]),
            rank=int(_number(get("rank")) or 0),
            winner=str(get("winner")).lower() == "true",
            n_test=int(_number(get("n_test")) or 0),
            accuracy=_number(get(ACCURACY), math.nan),
            accuracy_ci=(_number(get(ACCURACY_CI[0]), math.nan), _number(get(ACCURACY_CI[1]), math.nan)),
            tcb_mean=_number(get(TCB_MEAN), math.nan),
            tcb_geomean=_number(get(TCB_GEOMEAN), math.nan),
            tcb_median=_number(get(TCB_MEDIAN), math.nan),
            ppl_mean=_number(get(PPL_MEAN), math.nan),
            selected_by=_text(get(SELECTED_BY)),
            robustness={k: v for k, v in dict(row).items() if k not in known},
            trial=None if trial is None else int(trial),
            dev_accuracy=_number(get("dev_accuracy")),
            dev_correct=None if _missing(get("dev_correct")) else str(get("dev_correct")),
            dev_signed_stability=_number(get("dev_signed_stability")),
            cost=_number(get("cost")),
            card=_text(get("card")),
            members=_members(get("members")),
        )


def _number(value, default=None) -> float | None:
    """A finite or infinite float; `default` for a missing, NaN or unreadable value."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(number) else number


def _members(value) -> list | None:
    """An ensemble's member trials: a list, or the list as a CSV cell holds it ("[3, 1]"); None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return [int(v) for v in value] if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _text(value) -> str:
    return "" if _missing(value) else str(value)


__all__ = [
    "ACCURACY",
    "ACCURACY_CI",
    "DELTA_ACCURACY",
    "EXPORT_COLUMNS",
    "PPL_MEAN",
    "SEARCH_SECONDS",
    "SELECTED_BY",
    "TCB_GEOMEAN",
    "TCB_MEAN",
    "TCB_MEDIAN",
    "RunRow",
    "interval_columns",
    "sd_column",
]
