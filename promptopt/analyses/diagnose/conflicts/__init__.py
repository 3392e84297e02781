"""`promptopt diagnose conflicts`: accuracy–stability conflicts and δ_TCB-guided prompt enhancement
(δ_TCB paper §4.3, App. C.4.2, App. D.1, Table 3). The analysis on DataFrames; `workflows.run_conflicts`
scores, searches and stresses.

- classes.py: the four conflict classes per item (§4.3, D.1) and their shares with Wilson intervals
- question_sets.py: VCQ / AQ per question over baseline seeds (App. C.4.2), thresholds set on dev questions
- table3.py: Table 3, ours beside the paper's · result.py: what the analysis returns · figure.py: its figure
"""

from promptopt.analyses.diagnose.conflicts.classes import (
    CLASSES,
    CONFIDENCE_SIGNALS,
    ClassThresholds,
    class_summary,
    class_thresholds,
    classify_items,
    finite_quantile,
    log10_tcb,
)
from promptopt.analyses.diagnose.conflicts.figure import plot
from promptopt.analyses.diagnose.conflicts.question_sets import (
    AQ_ACC_MEAN,
    AQ_ACC_VAR,
    SET_QUANTILES,
    VCQ_ACC_MEAN,
    VCQ_ACC_VAR,
    SetThresholds,
    baseline_prompts,
    characterise,
    label_questions,
    set_summary,
    set_thresholds,
)
from promptopt.analyses.diagnose.conflicts.result import ConflictsResult
from promptopt.analyses.diagnose.conflicts.table3 import (
    PAPER_TABLE3,
    PAPER_TABLE3_COLUMNS,
    paper_table3_rows,
    table3_row,
)

__all__ = [
    "AQ_ACC_MEAN",
    "AQ_ACC_VAR",
    "CLASSES",
    "CONFIDENCE_SIGNALS",
    "PAPER_TABLE3",
    "PAPER_TABLE3_COLUMNS",
    "SET_QUANTILES",
    "VCQ_ACC_MEAN",
    "VCQ_ACC_VAR",
    "ClassThresholds",
    "ConflictsResult",
    "SetThresholds",
    "baseline_prompts",
    "characterise",
    "class_summary",
    "class_thresholds",
    "classify_items",
    "finite_quantile",
    "label_questions",
    "log10_tcb",
    "paper_table3_rows",
    "plot",
    "set_summary",
    "set_thresholds",
    "table3_row",
]
