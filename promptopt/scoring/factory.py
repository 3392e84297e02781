"""The one recipe for a scorer: settings -> (model, task data, result cache). It is picklable, so spawned
worker processes build their own from it instead of receiving live objects."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from promptopt.models.load import ModelConfig
from promptopt.scoring.cache import CachedScorer, ResultCache
from promptopt.scoring.scorer import Scorer
from promptopt.tasks.data import DataConfig, TaskData


@dataclass(frozen=True, kw_only=True)
class ScorerFactory:
    model: ModelConfig
    data: DataConfig
    cache_path: str | None = None  # SQLite result cache shared by every worker on this machine; None: no cache
    batch_size: int | str = 16  # or "auto" (models/batch_size.py)
    keep_hidden: bool = False  # the cache also keeps critical hidden states (calibrated decisions read δ_TCB from them)

    def build(self, data: TaskData | None = None, *, progress: bool = False) -> Scorer | CachedScorer:
        """Load the model (and the task data unless given) and wrap the scorer in the result cache."""
        data = data if data is not None else self.data.load()
        cache = (
            ResultCache(Path(self.cache_path)) if self.cache_path else None
        )  # a corrupt cache fails before the model loads
        stand_in = self.model.stand_in()  # a ModelRunner the Python API was given scores instead of a Runner
        lm = stand_in.lm if stand_in is not None else self.model.load()
        scorer = Scorer(lm, data, batch_size=self.batch_size, progress=progress, runner=stand_in)
        return CachedScorer(scorer, cache, keep_hidden=self.keep_hidden) if cache is not None else scorer

    def __call__(self) -> Scorer | CachedScorer:
        return self.build()
