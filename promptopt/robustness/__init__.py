"""Robustness: decoding-level taboo stress (taboo, stress) and perturbation suites (perturb, suite)."""

from promptopt.robustness.stress import StressResult, taboo_stress
from promptopt.robustness.suite import VariantExpander
from promptopt.robustness.taboo import TabooLog, TabooLogitsProcessor, mid_word_masks, word_initial_mask

__all__ = [
    "StressResult",
    "TabooLog",
    "TabooLogitsProcessor",
    "VariantExpander",
    "mid_word_masks",
    "taboo_stress",
    "word_initial_mask",
]
