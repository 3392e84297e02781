"""An experiment session: one model (loaded once, on first use), the task's data, one caching scorer and
one run directory. Every workflow (score, evaluate, stress, compare, export, report, diagnose) starts
from a session, so none assembles model + data + scorer its own way.

The task data is loaded and checked when the session is built; the model only when `scorer` is first
used, so a bad task or card fails before the (slow) model load.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from promptopt import progress
from promptopt.models.load import ModelConfig
from promptopt.prompts import Prompt, load_card
from promptopt.robustness.perturb import ParaphraseMemo
from promptopt.scoring import ScorerFactory
from promptopt.tasks.data import DataConfig, TaskData
from promptopt.tasks.item import Item


class Session:
    def __init__(
        self,
        *,
        model: ModelConfig,
        data: DataConfig,
        out: str | Path | None = None,
        batch_size: int = 16,
        progress: bool = False,
        keep_hidden: bool = False,
    ) -> None:
        self.out = Path(out) if out is not None else None
        self.factory = ScorerFactory(
            model=model,
            data=data,
            batch_size=batch_size,
            cache_path=str(self.out / "cache.sqlite") if self.out is not None else None,
            keep_hidden=keep_hidden,
        )
        self.progress = progress
        self.data: TaskData = data.load()
        self.paraphrases = ParaphraseMemo()  # LM paraphrases of this session's model, shared by every prompt
        self.flips: dict = {}  # (suite, dev limit) -> dev answers the suite changes (propose reflect), found once

    @property
    def model_config(self) -> ModelConfig:
        return self.factory.model

    @property
    def data_config(self) -> DataConfig:
        return self.factory.data

    @cached_property
    def scorer(self):
        """The session's scorer (cached when the session has a run directory); loads the model once."""
        progress.step(f"loading model {self.model_config.spec}")
        return self.factory.build(self.data, progress=self.progress or progress.bars())

    @property
    def lm(self):
        return self.scorer.lm

    # --- what to score ------------------------------------------------------------------------------
    def prompt(self, card: str | Path | None = None) -> Prompt:
        """A prompt card, or the task's own prompt."""
        return load_card(card)[0] if card else self.data.default_prompt()

    def items(self, split: str, limit: int | None = None) -> list[Item]:
        """A split's items; dev and test honour the session's limits, then `limit`."""
        if split == "dev":
            items = self.data_config.dev(self.data)
        elif split == "test":
            items = self.data_config.test(self.data)
        else:
            items = self.data.split(split)
        return items[:limit]
