"""Experiments: a session (one model, the task data, one caching scorer, one run directory) and the
workflows built on it (compare). The layer above search and robustness: it hands both the same scorer."""

from promptopt.experiments.compare import run_compare
from promptopt.experiments.session import Session

__all__ = ["Session", "run_compare"]
