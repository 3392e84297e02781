"""One family's variants of a prompt on a set of items, and why the others were dropped (not applicable, a
protected word changed, the text unchanged, too dissimilar)."""

from __future__ import annotations

from promptopt.prompts import Prompt
from promptopt.robustness.perturb import OPERATORS, Variant, protected_words, protection_holds, variant_seed
from promptopt.robustness.suite.similarity import Similarity
from promptopt.robustness.suite.spec import Family, Suite
from promptopt.tasks import Item


def make_variants(
    suite: Suite, family: Family, prompt: Prompt, items: list[Item], context: dict, similarity: Similarity
):
    """Variants of one family for every item (× variants_per_item), with drop counts by reason."""
    operator = OPERATORS[family.operator](**family.options)
    counts = {"not_applicable": 0, "protection": 0, "unchanged": 0, "similarity": 0}
    kept: list[Variant] = []
    for index in range(operator.n_variants(suite.variants_per_item)):
        seeds = [variant_seed(suite.seed, family.name, item.id, index) for item in items]
        made = operator.apply_many(prompt, items, seeds, {**context, "index": index, "seed": suite.seed})
        candidates = []
        for item, variant in zip(items, made):
            if variant is None:
                counts["not_applicable"] += 1
            elif not protection_holds(item.question, variant.item.question, protected_words(prompt, item)):
                counts["protection"] += 1
            elif operator.changes_text and variant.item.question == item.question:
                counts["unchanged"] += 1
            else:
                candidates.append((variant, item))
        if operator.changes_text and candidates:
            scores = similarity([o.question for _, o in candidates], [v.item.question for v, _ in candidates])
            for (variant, _item), score in zip(candidates, scores):
                if score >= suite.similarity_threshold:
                    kept.append(variant)
                else:
                    counts["similarity"] += 1
        else:
            kept.extend(variant for variant, _ in candidates)
    return kept, counts
