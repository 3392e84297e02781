"""Perturbation suites: YAML -> Suite, and a prompt's robustness on one set of items.

- spec.py: a suite from YAML, its content hash, the families a search has seen
- similarity.py: sentence-embedding similarity of a variant to its original (memoized)
- variants.py: one family's variants and the reasons the others were dropped
- evaluate.py: evaluate_robustness, every family scored beside the clean items, with the summary numbers
- items.py: every answer as one table (ITEM_COLUMNS) · expander.py: the `robust` strategy's variants
"""

from promptopt.robustness.perturb import OPERATORS  # the operators a family may name
from promptopt.robustness.suite.evaluate import SPLITS, RobustnessResult, evaluate_robustness, split_summary
from promptopt.robustness.suite.expander import VariantExpander
from promptopt.robustness.suite.items import ITEM_COLUMNS, ITEM_SIGNALS, items_table
from promptopt.robustness.suite.similarity import Similarity
from promptopt.robustness.suite.spec import (
    BUILTIN_DIR,
    Family,
    Suite,
    builtin_suite_names,
    load_suite,
    parse_suite,
    seen_families,
    suite_sha256,
)
from promptopt.robustness.suite.variants import make_variants

__all__ = [
    "BUILTIN_DIR",
    "ITEM_COLUMNS",
    "ITEM_SIGNALS",
    "OPERATORS",
    "SPLITS",
    "Family",
    "RobustnessResult",
    "Similarity",
    "Suite",
    "VariantExpander",
    "builtin_suite_names",
    "evaluate_robustness",
    "items_table",
    "load_suite",
    "make_variants",
    "parse_suite",
    "seen_families",
    "split_summary",
    "suite_sha256",
]
