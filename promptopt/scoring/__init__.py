"""Scoring: a prompt × items -> per-item table (scorer), the per-item result cache wrapped around it
(cache), and a picklable recipe for both (factory) for worker processes."""

from promptopt.scoring.cache import CachedScorer, ResultCache
from promptopt.scoring.factory import ScorerFactory
from promptopt.scoring.scorer import Scorer, ScoreResult, summarize

__all__ = ["CachedScorer", "ResultCache", "ScoreResult", "Scorer", "ScorerFactory", "summarize"]
