"""What a compare writes in its run directory: the strategy table (compare.csv / .parquet), every evaluated
candidate (compare_runs.csv), the pairs (compare_paired.csv), every winner's answers (test_items.parquet and,
with a suite, robustness_items.parquet) and summary.json: each file atomically, and the whole as one table set
(study/tableset.py) sealed by tables.json, so a reader tells a complete set from an interrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from promptopt.study.tableset import TableSet

ITEMS_FILE = "robustness_items.parquet"
TEST_ITEMS_FILE = "test_items.parquet"  # every winner's test answers: what `pair` pairs, whichever trial won


def _winner_rows(winners: dict, table_of) -> pd.DataFrame | None:
    """One table of every winner's rows (`table_of(evaluation)`), strategy and seed first; the baseline once (seed 0)."""
    tables = [
        (name, s, table_of(ev))
        for name, evaluations in winners.items()
        for s, ev in enumerate(evaluations[:1] if name == "baseline" else evaluations)
    ]
    parts = [table.assign(strategy=name, seed=s) for name, s, table in tables if table is not None]
    if not parts:
        return None
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "seed", *[c for c in table.columns if c not in ("strategy", "seed")]]]


def winner_robustness_answers(winners: dict) -> pd.DataFrame | None:
    """Every winner's answers, one row per (strategy, seed, item, family, variant)."""
    return _winner_rows(winners, lambda ev: ev.items)


def winner_test_answers(winners: dict) -> pd.DataFrame | None:
    """Every winner's test answers, one row per (strategy, seed, item). With `select="robust"` a winner need not
    be its search's best trial, whose table is the run directory's."""
    from promptopt.scoring.stored import answer_columns

    rows = _winner_rows(winners, lambda ev: ev.test)
    return None if rows is None else answer_columns(rows)  # gold and pred as `score --out` types them


def write_outputs(
    out: Path, table, runs, paired, summary, items: pd.DataFrame | None = None, test_items: pd.DataFrame | None = None
) -> None:
    """Every table of the compare, then summary.json, then tables.json: the set is complete."""
    tables = TableSet(out, "compare").begin()
    tables.file("compare.csv", lambda p: table.to_csv(p, index=False))
    tables.file("compare.parquet", lambda p: table.to_parquet(p, index=False))
    tables.file("compare_runs.csv", lambda p: runs.to_csv(p, index=False))
    tables.file("compare_paired.csv", lambda p: paired.to_csv(p, index=False))
    if items is not None:
        tables.file(ITEMS_FILE, lambda p: items.to_parquet(p, index=False))
    if test_items is not None:
        tables.file(TEST_ITEMS_FILE, lambda p: test_items.to_parquet(p, index=False))
    tables.text("summary.json", json.dumps(summary, indent=1, default=str))
    tables.seal()
