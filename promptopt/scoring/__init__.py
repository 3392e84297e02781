"""Scoring: a prompt × items -> per-item table (scorer), the per-item result cache wrapped around it
(cache), a picklable recipe for both (factory) for worker processes, and the contracts search and
robustness hold a scorer to (api)."""

from promptopt.scoring.api import CachingScorer, PromptScorer
from promptopt.scoring.cache import CachedScorer, ResultCache
from promptopt.scoring.factory import ScorerFactory
from promptopt.scoring.scorer import Scorer, ScoreResult, summarize

__all__ = [
    "CachedScorer",
    "CachingScorer",
    "PromptScorer",
    "ResultCache",
    "ScoreResult",
    "Scorer",
    "ScorerFactory",
    "summarize",
]
