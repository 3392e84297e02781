"""One task example in canonical form, whatever the data looked like."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
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
    # Partial evaluation (lm-eval's multiple inputs, Winogrande): the choices are alternative *contexts* and this is
    # the continuation scored after each one; `question` is then the gold context, `target` this continuation.
    continuation: str | None = None

    @property
    def partial(self) -> bool:
        return self.continuation is not None

    def as_exemplar(self) -> Exemplar:
        if self.partial:  # a shot shows the gold context and the shared continuation (lm-eval: c[q] + target)
            return Exemplar(id=self.id, question=self.question, answer=self.target)
        gold = self.gold if self.choices is not None else None
        return Exemplar(id=self.id, question=self.question, answer=self.target, choices=self.choices, gold=gold)


# Item fields that cannot change a scored row; every other field (added ones too) counts.
NOT_SCORED = frozenset({"where"})  # where the item was read from: only for messages
# Fields added after items were first hashed, with the value every earlier item had: they count only when set, so
# the items that do not use them keep their hashes (result caches, studies and cards made before stay valid).
ADDED_LATER = {"continuation": None}


def item_content(item: Item) -> dict:
    """Every field a scored row depends on (`meta` too: HumanEval's entry point judges the code): what the
    result cache, a study's identity and a card's fingerprint hash, so an edited target is never stale."""
    return {
        f.name: getattr(item, f.name)
        for f in fields(item)
        if f.name not in NOT_SCORED and not (f.name in ADDED_LATER and getattr(item, f.name) == ADDED_LATER[f.name])
    }


def items_sha256(items) -> str:
    blob = json.dumps([item_content(i) for i in items], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
