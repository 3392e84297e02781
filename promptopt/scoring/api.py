"""The contracts search and robustness hold a scorer to (they receive one and never build it).

`PromptScorer`: what robustness needs (score a prompt on items, generate and judge answers, and reach the
model and the task data). `CachingScorer`: what a search needs on top (per-item tables served from a result
cache whose hits it counts). `Scorer` is a PromptScorer; `CachedScorer` is both.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import pandas as pd

from promptopt.models.api import ModelRunner
from promptopt.models.load import LoadedModel
from promptopt.prompts import Prompt
from promptopt.scoring.cache import ResultCache
from promptopt.scoring.scorer import ScoreResult
from promptopt.tasks import Item, TaskData


@runtime_checkable
class PromptScorer(Protocol):
    lm: LoadedModel
    data: TaskData
    runner: ModelRunner

    def score(self, prompt: Prompt, items: list[Item]) -> ScoreResult:
        """The per-item table (correct, pred, δ_TCB, V_eff, margin, PPL ...) and its summary."""
        ...

    def check_fits(self, prompt: Prompt, items: list[Item]) -> None:
        """Raise PromptTooLongError if a rendered prompt exceeds the model's context."""
        ...

    def generate_answers(
        self,
        prompt: Prompt,
        items: list[Item],
        *,
        processor_factory=None,
        temperature: float = 0.0,
        seed: int | None = None,
        keep_hidden: bool = True,
    ) -> list:
        """(generation, judgement) per item, with the task's decoding settings."""
        ...

    def judge(self, item: Item, text: str, prompt: Prompt | None = None): ...


@runtime_checkable
class CachingScorer(PromptScorer, Protocol):
    cache: ResultCache

    def score_table(self, prompt: Prompt, items: list[Item]) -> pd.DataFrame: ...
