"""Which prompt a compare directory exports, by dev numbers alone: its candidates (compare_runs.csv: each search's
top-N with its dev answers) and the winner the selection rule chooses among the searches' winners
(metrics/stats/selection.py: the tie set on the same dev items, then the tie-break). Test numbers are never read."""

from __future__ import annotations

import math
from pathlib import Path

from promptopt.errors import UserError
from promptopt.study.tableset import check_table_set
from promptopt.workflows.compare.entries import ENSEMBLE_SUFFIX
from promptopt.workflows.compare.records import EXPORT_COLUMNS, RunRow

EXPORT_SELECTIONS = ("dev", "robust")  # export --select: which of a compare's candidates a card is made from


def is_compare_dir(root: Path) -> bool:
    """A compare directory, finished or not: its tables, or the evaluations it stores before any table."""
    return any((root / n).is_file() for n in ("compare.csv", "compare_runs.csv")) or (root / "evaluations").is_dir()


def compare_candidates(root: Path):
    """Every prompt a compare evaluated for a searched strategy (compare_runs.csv: each search's top-N, with its
    dev accuracy), in the compare's order, from its complete table set. Selection reads the dev columns only."""
    import pandas as pd

    check_table_set(root, "compare")
    path = root / "compare_runs.csv"
    if not path.is_file():
        raise UserError(f"{root}: compare_runs.csv missing: the compare did not finish (rerun it with --resume)")
    runs = pd.read_csv(path)
    missing = EXPORT_COLUMNS - set(runs.columns)
    if missing:
        raise UserError(
            f"{path}: written by an older promptopt (no {', '.join(sorted(missing))} column): rerun the compare"
        )
    # the searches' candidates: not the baseline, nor the ensembles compare built (export them with --ensemble K)
    is_ensemble = runs["strategy"].astype(str).str.contains(ENSEMBLE_SUFFIX.pattern, regex=True)
    searched = runs[(runs["strategy"] != "baseline") & ~is_ensemble].reset_index(drop=True)
    if searched.empty:
        raise UserError(f"{path}: no searched strategy in the comparison")
    return searched.assign(order=range(len(searched)))


def select_by_dev(candidates, strategy: str | None = None, *, tie_break: str | None = None):
    """Among the searches' own winners (of `strategy`, else of every strategy), the selection rule's choice: the
    winners not significantly worse than the most dev-accurate on the same dev items tie, and `tie_break` (default
    `EXPORT_TIE_BREAK`: a plain argmax winner first, then stability) chooses; full ties go to the strategy compared
    first, then the lower seed. -> (row, how, the rule's record). Test numbers are never read."""
    from promptopt.metrics.stats.selection import EXPORT_TIE_BREAK, choose

    winners = candidates[candidates["winner"].astype(bool)]
    if strategy is not None:
        winners = winners[winners["strategy"] == strategy]
    selection = choose([candidate_of(row) for _, row in winners.iterrows()], tie_break=tie_break or EXPORT_TIE_BREAK)
    best = winners[winners["order"] == selection.winner.key].iloc[0]
    among = f"the {len(winners)} {strategy + ' ' if strategy else ''}search winners"
    return best, f"among {among}: {selection.describe()}", selection.record()


def candidate_of(row):
    """A compare_runs.csv row as the selection rule sees it: its dev answers and dev-side numbers (never a test
    column). A strategy entry `name@rule` with a calibrated rule is a calibrated candidate."""
    from promptopt.decision import parse_rule
    from promptopt.metrics.stats.selection import Candidate, decode_answers

    run = RunRow.from_columns(row)
    entry = run.strategy
    rule = entry.split("@", 1)[1] if "@" in entry else "argmax"
    correct = decode_answers(run.dev_correct)
    if correct is None:
        raise UserError(
            f"compare_runs.csv: {entry} seed {run.seed}: no per-item dev answers (dev_correct): rerun the compare"
        )
    return Candidate(
        key=int(row["order"]),
        label=f"{entry} seed {run.seed} trial {int(row['trial'])}",
        correct=correct,
        order=int(row["order"]),
        stability=math.nan if run.dev_signed_stability is None else run.dev_signed_stability,
        cost=math.nan if run.cost is None else run.cost,
        calibrated=parse_rule(rule).calibrated,
    )


def strategy_rows(candidates, strategy: str | None, root: Path):
    if strategy is None:
        return candidates
    if strategy not in set(candidates["strategy"]):
        raise UserError(f"--strategy {strategy}: {root} compares {', '.join(dict.fromkeys(candidates['strategy']))}")
    return candidates[candidates["strategy"] == strategy]


def plain_row(row) -> dict:
    """A compare_runs.csv row as a plain dict, NaN as None (it travels as `pick` to `open_run`)."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.to_dict().items()}
