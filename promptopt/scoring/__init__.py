"""Scoring: a prompt × items -> per-item table (scorer), and the per-item result cache wrapped around it
(cache)."""

from promptopt.scoring.cache import CachedScorer, ResultCache
from promptopt.scoring.scorer import Scorer, ScoreResult, summarize

__all__ = ["CachedScorer", "ResultCache", "ScoreResult", "Scorer", "summarize"]
