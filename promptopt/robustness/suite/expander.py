"""The perturbed variants the `robust` search strategy scores beside the clean items, memoized across trials."""

from __future__ import annotations

import json

from promptopt.prompts import Prompt
from promptopt.robustness.perturb import OPERATORS, Variant, protected_words
from promptopt.robustness.suite.similarity import Similarity
from promptopt.robustness.suite.spec import Suite, load_suite, suite_sha256
from promptopt.robustness.suite.variants import make_variants
from promptopt.tasks import Item


class VariantExpander:
    """Perturbed variants of items for a prompt, as (variant prompt, variant items) groups: what the
    `robust` search strategy scores beside the clean items. Picklable (worker processes rebuild their
    own state); variants are memoized across trials — the text variants of an item are the same for every
    prompt that protects the same words — and scored through the caching scorer."""

    def __init__(self, suite: str = "cheap") -> None:
        self.suite_name = suite
        self._suite: Suite | None = None
        self._similarity: Similarity | None = None
        self._memo: dict = {}

    def __getstate__(self):
        return {"suite_name": self.suite_name, "_suite": None, "_similarity": None, "_memo": {}}

    def fingerprint(self) -> str:
        """The hash of the suite's content: what a robust trial's value depends on (part of a study's identity)."""
        return suite_sha256(self._suite or load_suite(self.suite_name))

    def __call__(self, scorer, prompt: Prompt, items: list[Item]) -> list[tuple[Prompt, list[Item]]]:
        if self._suite is None:
            self._suite, self._similarity = load_suite(self.suite_name), Similarity()
        context = {
            "pool": scorer.data.pool,
            "evaluated": {i.id for i in items},
            "distractors": list(self._suite.distractors),
            "lm": scorer.lm,
            "runner": scorer.runner,
        }
        groups: dict[str, tuple[Prompt, list[Item]]] = {}
        for family in self._suite.families:
            if OPERATORS[family.operator].changes_text:
                key = lambda item, f=family: (f.name, item.id, item.question, tuple(protected_words(prompt, item)))  # noqa: E731
                todo = [item for item in items if key(item) not in self._memo]
                if todo:
                    kept, _ = make_variants(self._suite, family, prompt, todo, context, self._similarity)
                    by_id = {v.item.id: v.item for v in kept}
                    for item in todo:
                        self._memo[key(item)] = by_id.get(item.id)
                variants = [
                    Variant(prompt, self._memo[key(item)]) for item in items if self._memo[key(item)] is not None
                ]
            else:
                variants, _ = make_variants(self._suite, family, prompt, items, context, self._similarity)
            for variant in variants:
                card = json.dumps(variant.prompt.to_card(), sort_keys=True)
                groups.setdefault(card, (variant.prompt, []))[1].append(variant.item)
        return list(groups.values())
