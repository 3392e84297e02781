"""Equivalent prompt formats (FormatSpread): hand-checked renderings, label words kept, the `format` family's
variants, and the format spread against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from promptopt.errors import ConfigError
from promptopt.metrics.stats import format_spread
from promptopt.prompt_formats import PromptFormat, format_choices
from promptopt.prompts import Exemplar, Prompt, PromptTemplate
from promptopt.robustness.perturb import FormatOperator
from promptopt.robustness.suite import make_variants, parse_suite
from promptopt.tasks import Item

SST2 = PromptTemplate(query="Review: {question}\nSentiment:", label_words=("negative", "positive"))
SHOT = Exemplar(id="s1", question="A joy.", answer="positive", choices=("neg", "pos"), gold=1)
PROMPT = Prompt(task="sst2", instruction="Classify the review.", exemplars=(SHOT,), template=SST2)


def test_the_identity_format_changes_nothing():
    assert PromptFormat().apply(SST2) == SST2


@pytest.mark.parametrize(
    "fmt, context, continuation",
    [
        (
            PromptFormat(field_separator=" - "),
            "Classify the review.\n\nReview - A joy.\nSentiment - positive\n\nReview - Dull.\nSentiment -",
            " positive",
        ),
        (
            PromptFormat(field_separator=":\n", casing="upper", line_joiner="\n\n", exemplar_delimiter="\n---\n"),
            "Classify the review.\n---\nREVIEW:\nA joy.\n\nSENTIMENT:\npositive\n---\nREVIEW:\nDull.\n\nSENTIMENT:",
            "\npositive",
        ),
        (
            PromptFormat(field_separator=" ", casing="lower"),
            "Classify the review.\n\nreview A joy.\nsentiment positive\n\nreview Dull.\nsentiment",
            " positive",
        ),
    ],
)
def test_formats_render_hand_checked_prompts_and_keep_the_label_words(fmt, context, continuation):
    prompt = PROMPT.with_(template=fmt.apply(SST2))
    assert prompt.context("Dull.", ("neg", "pos")) == context
    assert prompt.choice_texts(("neg", "pos")) == ["negative", "positive"]  # label words untouched
    assert prompt.continuation("positive") == continuation  # shots and query answer the same way


def test_fields_inside_a_line_and_plain_lines_are_left_alone():
    template = PromptTemplate(query="{question}\nQuestion: Is it true?\nAnswer:", exemplar=None)
    out = PromptFormat(field_separator=" - ", casing="title").apply(template)
    assert out.query == "{question}\nQuestion - Is it true?\nAnswer -"
    explicit = PromptTemplate(query="Q: {question}\nA:", exemplar="Q: {question}\nA: {answer}")
    assert PromptFormat(casing="lower").apply(explicit).exemplar == "q: {question}\na: {answer}"


def test_format_family_is_one_prompt_per_variant_index_and_seeded():
    suite = parse_suite({"seed": 7, "families": {"format": {"operator": "format", "variants": 3}}}, "s.yaml")
    items = [Item(f"i{n}", f"Review number {n}.", 1, "positive", ("neg", "pos")) for n in range(4)]
    kept, counts = make_variants(suite, suite.families[0], PROMPT, items, {"seed": 7}, similarity=None)
    assert len(kept) == 12 and sum(counts.values()) == 0
    templates = [v.prompt.template for v in kept]
    assert len(set(templates)) == 3 and SST2 not in templates  # 3 distinct formats, none the original
    assert all(v.item == item for v, item in zip(kept, items * 3))  # the items themselves never change
    again, _ = make_variants(suite, suite.families[0], PROMPT, items, {"seed": 7}, similarity=None)
    assert [v.prompt for v in again] == [v.prompt for v in kept]
    with pytest.raises(ConfigError, match="variants must be an integer from 1 to 8"):
        FormatOperator(variants=9)


def test_format_spread_against_hand_values():
    # 4 items × 3 formats: accuracies 3/4, 1/4, 2/4 -> spread 0.5; the item with a missing format is left out
    correct = np.array([[1, 0, 1], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, np.nan, 0]])
    out = format_spread(correct, n_boot=200, seed=0)
    assert out["spread"] == pytest.approx(0.5) and out["n_items"] == 4 and out["n_formats"] == 3
    assert out["accuracies"] == pytest.approx([0.75, 0.25, 0.5])
    low, high = out["ci95"]
    assert 0 <= low <= 0.5 <= high <= 1
    assert format_spread(np.ones((5, 2)))["spread"] == 0 and np.isnan(format_spread(np.ones((5, 1)))["spread"])


def test_a_space_formats_block_is_validated():
    assert format_choices({"casing": ["lower", "upper"], "field_separator": True}, "s.yaml") == {
        "casing": ("lower", "upper"),
        "field_separator": (": ", ":\n", " - ", " "),
    }
    with pytest.raises(ConfigError, match=r"s\.yaml: formats\.spacing: unknown format dimension"):
        format_choices({"spacing": True}, "s.yaml")
    with pytest.raises(ConfigError, match=r"formats\.casing: expected true or a list"):
        format_choices({"casing": ["shouting"]}, "s.yaml")


def test_a_space_searches_formats_of_its_templates():
    import optuna

    from promptopt.study import parse_space
    from promptopt.tasks import load_task

    data = load_task("sst2")
    space = parse_space(
        {
            "task": "sst2",
            "instructions": {"none": ""},
            "exemplars": {"k": [0, 0]},
            "templates": {"review": {"query": "Review: {question}\nSentiment:"}},
            "formats": {"field_separator": [": ", " - "], "casing": True},
        },
        "space.yaml",
    )
    params = {
        "instruction": "none",
        "template": "review",
        "format_field_separator": " - ",
        "format_casing": "upper",
        "k": 0,
    }
    prompt = space.suggest(optuna.trial.FixedTrial(params), space.check_against(data), data.spec)
    assert prompt.template.query == "REVIEW - {question}\nSENTIMENT -" and prompt.template.name == "review"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    space.suggest(trial, space.check_against(data), data.spec)
    assert {"format_field_separator", "format_casing"} <= set(trial.params)
    assert space.widest_format(space.templates["review"]).query == "Review - {question}\nSentiment -"  # longest choices
