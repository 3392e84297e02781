"""One task example in canonical form, whatever the data looked like."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from promptopt.card import sha256_json
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


def item_content(item: Item) -> list:
    """Every field of an item that a scored row depends on (id, text, choices, gold, target), as plain JSON:
    what the result cache, a study's identity and a card's fingerprint hash. `meta` and `where` are notes."""
    gold = list(item.gold) if isinstance(item.gold, tuple) else item.gold
    return [item.id, item.question, list(item.choices) if item.choices else None, repr(gold), item.target]


def items_sha256(items) -> str:
    return sha256_json([item_content(i) for i in items])
