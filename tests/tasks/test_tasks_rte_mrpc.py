"""The GLUE sentence-pair tasks RTE and MRPC: their carving, rows checked by hand against the shipped Arrow
data, the rendered default prompt and their own search spaces. (Loading, disjointness and seeding of every
built-in task are also covered by test_tasks.py; the spaces' fit to their tasks by test_search.py.)"""

from __future__ import annotations

import pytest

from promptopt.prompts import Prompt
from promptopt.study.space import load_space
from promptopt.tasks import load_task
from promptopt.tasks.data import load_rows, to_item

SIZES = {"rte": (277, 32, 100, 145), "mrpc": (408, 48, 100, 260)}  # validation rows, pool, dev, test


@pytest.mark.parametrize("name", sorted(SIZES))
def test_carving_uses_every_validation_row_once_with_the_stated_sizes(name):
    rows, pool, dev, test = SIZES[name]
    data = load_task(name)
    assert (len(data.pool), len(data.dev), len(data.test)) == (pool, dev, test)
    ids = [i.id for role in ("pool", "dev", "test") for i in data.split(role)]
    assert len(ids) == len(set(ids)) == rows == len(load_rows(data.spec, "validation"))
    for role in ("pool", "dev", "test"):  # both labels in every role, so shots and measurements see both
        assert {i.gold for i in data.split(role)} == {0, 1}
    assert len(data.test) >= 100


def _row(name, index):
    spec = load_task(name).spec
    return to_item(spec, *load_rows(spec, "validation")[index])


def test_rte_rows_checked_by_hand():
    """GLUE RTE: label 0 = entailment (' True'), 1 = not_entailment (' False'); idx is the row's own id."""
    reeve = _row("rte", 0)
    assert reeve.id == "rte-0"
    assert reeve.question == (
        "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according to the "
        "Christopher Reeve Foundation.\nQuestion: Christopher Reeve had an accident."
    )
    assert reeve.choices == ("True", "False") and reeve.gold == 1 and reeve.target == "False"
    bacteria = _row("rte", 1)
    assert bacteria.id == "rte-1" and bacteria.question.endswith(
        "\nQuestion: Bacteria is winning the war against antibiotics."
    )
    assert bacteria.question.startswith("Yet, we now are discovering that antibiotics are losing their effectiveness")
    assert bacteria.gold == 0 and bacteria.target == "True"
    cairo = _row("rte", 2)
    assert cairo.question.endswith("Question: 15 million tonnes of rubbish are produced daily in Cairo.")
    assert cairo.target == "False"  # the passage says 15 million people and 10,000 tonnes


def test_mrpc_rows_checked_by_hand():
    """GLUE MRPC: label 0 = not_equivalent ('no'), 1 = equivalent ('yes'); ids are MRPC's own idx (not row numbers)."""
    pie = _row("mrpc", 0)
    assert pie.id == "mrpc-9"
    assert pie.question == (
        "Sentence 1: He said the foodservice pie business doesn 't fit the company 's long-term growth strategy .\n"
        'Sentence 2: " The foodservice pie business does not fit our long-term growth strategy .'
    )
    assert pie.choices == ("no", "yes") and pie.gold == 1 and pie.target == "yes"
    dollar = _row("mrpc", 2)  # the same market report with different figures: not equivalent
    assert dollar.id == "mrpc-25" and dollar.question.startswith("Sentence 1: The dollar was at 116.92 yen")
    assert "\nSentence 2: The dollar was at 116.78 yen" in dollar.question
    assert dollar.gold == 0 and dollar.target == "no"


def test_default_prompts_render_lm_eval_phrasing():
    rte = load_task("rte")
    prompt = rte.default_prompt()
    assert len(prompt.exemplars) == 2 and {e.id for e in prompt.exemplars} <= {i.id for i in rte.pool}
    item = rte.dev[0]
    text = prompt.context(item.question, item.choices)
    first, second = prompt.exemplars
    assert text.startswith(f"{first.question} True or False?\nAnswer: {first.choices[first.gold]}\n\n")
    assert text.endswith(f"\n\n{item.question} True or False?\nAnswer:")
    assert "\nQuestion: " in text and text.count("Answer:") == 3
    assert [prompt.continuation(t) for t in prompt.choice_texts(item.choices)] == [" True", " False"]

    mrpc = load_task("mrpc")
    prompt = mrpc.default_prompt()
    item = mrpc.dev[0]
    text = prompt.context(item.question, item.choices)
    assert text.endswith("\nQuestion: Do both sentences mean the same thing?\nAnswer:")
    assert text.split("\n\n")[-1].startswith("Sentence 1: ") and "\nSentence 2: " in text.split("\n\n")[-1]
    assert [prompt.continuation(t) for t in prompt.choice_texts(item.choices)] == [" no", " yes"]


@pytest.mark.parametrize("name", sorted(SIZES))
def test_own_search_space(name, embedded_dir):
    from transformers import AutoTokenizer

    space = load_space(name)
    data = load_task(name)
    candidates = space.check_against(data)
    assert space.task == name and len(candidates) == space.candidates
    assert 5 <= len(space.instructions) <= 7 and {"none", "zero_shot_cot"} <= set(space.instructions)
    assert 2 <= len(space.templates) <= 3 and space.k_max <= 4
    templates = space.templates.values()
    assert any(t.chat for t in templates)
    other_words = [t.label_words for t in templates if t.label_words]
    assert other_words and all(len(w) == 2 and tuple(w) != data.dev[0].choices for w in other_words)
    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)  # SmolLM2's, with its ChatML template
    item = data.dev[0]
    shots = tuple(c.as_exemplar() for c in candidates[: space.k_max])
    for template in templates:
        prompt = Prompt(task=name, instruction=space.instructions["task_specific"], exemplars=shots, template=template)
        text = prompt.context(item.question, item.choices, tokenizer)
        assert item.question in text and text.count(item.question.split("\n")[0]) == 1
        words = prompt.choice_texts(item.choices)
        assert words == list(template.label_words or item.choices)
        if template.chat:
            assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>system\n" in text
        else:  # each shot answers with its own label word, in the template's words
            for shot in shots:
                assert (
                    prompt.exemplar_text(shot).endswith(f" {words[shot.gold]}") and prompt.exemplar_text(shot) in text
                )
