"""What `diagnose conflicts` found: the classes, the question sets and Table 3, with the thresholds behind them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from promptopt.analyses.diagnose.conflicts.classes import ClassThresholds
from promptopt.analyses.diagnose.conflicts.question_sets import SetThresholds


@dataclass
class ConflictsResult:
    items: pd.DataFrame  # the prompt's scored dev + test items with their classes
    classes: pd.DataFrame  # class_summary
    class_thresholds: ClassThresholds
    runs: pd.DataFrame  # one row per (seed, item): the baseline seeds' scores
    questions: pd.DataFrame  # one row per question: over-seed statistics, VCQ / AQ
    set_thresholds: SetThresholds
    sets: pd.DataFrame  # set_summary
    table3: pd.DataFrame  # ours (baseline, enhanced per set) and the paper's rows
    search: object = None  # the SearchResult of the targeted search
    notes: list = dataclasses.field(default_factory=list)
