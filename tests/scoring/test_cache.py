"""The result cache's key: a row is reused only for the same model, prompt and item content."""

from __future__ import annotations

import dataclasses

import pytest

from promptopt.scoring import CachedScorer, ResultCache, Scorer
from promptopt.tasks import Item, load_task
from promptopt.tasks.item import NOT_SCORED

# For each Item field, a value different from the sample item's; a new field must be added here (or to
# NOT_SCORED when it cannot change a scored row), so it cannot be left out of the key unnoticed.
ITEM = Item("q1", "What is 2 + 3?", "5", "2 + 3 = 5", ("4", "5"), {"entry_point": "f"}, where="data.jsonl line 1")
OTHER = {
    "id": "q2",
    "question": "What is 2 + 4?",
    "gold": "6",
    "target": "2 + 3 makes 5",
    "choices": ("5", "4"),
    "meta": {"entry_point": "g"},
    "where": "data.jsonl line 9",
    "continuation": " is the answer.",  # set only by partial-evaluation tasks (Winogrande); None keeps old keys
}


def test_every_item_field_is_in_the_key_or_declared_irrelevant(tiny_lm, tmp_path):
    cached = CachedScorer(Scorer(tiny_lm, load_task("basic_arithmetic")), ResultCache(tmp_path / "c.sqlite"))
    prompt = cached.data.default_prompt()
    names = {f.name for f in dataclasses.fields(Item)}
    assert names == set(OTHER), f"give new Item fields {sorted(names - set(OTHER))} a test value"
    for name in sorted(names):
        changed = cached.key(prompt, dataclasses.replace(ITEM, **{name: OTHER[name]})) != cached.key(prompt, ITEM)
        assert changed == (name not in NOT_SCORED), name


def test_edited_target_is_scored_again(tiny_lm, tmp_path):
    """A generative item's target feeds the PPL columns: editing the reference must not reuse its old row."""
    task = load_task("basic_arithmetic")
    cache = ResultCache(tmp_path / "c.sqlite")
    cached = CachedScorer(Scorer(tiny_lm, task), cache)
    prompt, item = task.default_prompt(), task.test[0]
    first = cached.score_table(prompt, [item])
    assert (cache.hits, cache.misses) == (0, 1)
    again = cached.score_table(prompt, [item])
    assert (cache.hits, cache.misses) == (1, 1)  # unchanged item: a hit
    assert again.equals(first)
    edited = dataclasses.replace(item, target=f"The answer is {item.target}")
    fresh = cached.score_table(prompt, [edited])
    assert (cache.hits, cache.misses) == (1, 2)  # edited target: a miss, scored again
    assert fresh.loc[0, "ppl"] != pytest.approx(first.loc[0, "ppl"])
    assert fresh.loc[0, "ppl"] == pytest.approx(Scorer(tiny_lm, task).score(prompt, [edited]).table.loc[0, "ppl"])
