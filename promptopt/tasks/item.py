"""One task example in canonical form, whatever the data looked like."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from promptopt.prompts import Exemplar


@dataclass(frozen=True)
class Item:
    id: str
    question: str  # the rendered doc_to_text: what a template's {question} shows
    gold: Any  # choices: index; number: string; alias_match: tuple of aliases; code: test program
    target: str  # answer text an exemplar shows (gold choice, solution, first alias, reference code)
    choices: tuple[str, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)
    where: str = field(default="", compare=False, hash=False)  # file and line it came from, for messages

    def as_exemplar(self) -> Exemplar:
        gold = self.gold if self.choices is not None else None
        return Exemplar(id=self.id, question=self.question, answer=self.target, choices=self.choices, gold=gold)
