"""Prompt rendering (plain and chat) and the prompt card's round trip and validation."""

from __future__ import annotations

import pytest

from promptopt.errors import ConfigError
from promptopt.prompts import Exemplar, Prompt, PromptTemplate, load_card, save_card

SHOTS = (
    Exemplar(id="a", question="great fun", answer="positive", choices=("negative", "positive"), gold=1),
    Exemplar(id="b", question="dull mess", answer="negative", choices=("negative", "positive"), gold=0),
)


def _prompt(**template):
    return Prompt(
        task="sst2",
        instruction="Classify the review.",
        exemplars=SHOTS,
        template=PromptTemplate(query="Review: {question}\nSentiment:", **template),
    )


def test_plain_rendering_orders_instruction_exemplars_query():
    text = _prompt().context("it is fine", ("negative", "positive"))
    assert text == (
        "Classify the review.\n\nReview: great fun\nSentiment: positive\n\n"
        "Review: dull mess\nSentiment: negative\n\nReview: it is fine\nSentiment:"
    )
    assert _prompt().continuation("positive") == " positive"


def test_label_words_and_letters():
    words = _prompt(label_words=("bad", "good"))
    assert words.choice_texts(("negative", "positive")) == ["bad", "good"]
    assert "Sentiment: good" in words.context("x", ("negative", "positive"))
    letters = Prompt(
        task="t",
        exemplars=SHOTS,
        template=PromptTemplate(query="{question}\n{options}\nAnswer:", choice_format="letter"),
    )
    text = letters.context("pick", ("red", "blue"))
    assert "pick\nA. red\nB. blue\nAnswer:" in text and "Answer: B" in text
    assert letters.choice_texts(("red", "blue")) == ["A", "B"]
    with pytest.raises(ConfigError, match="label_words has 2 words but items have 3"):
        words.choice_texts(("a", "b", "c"))


def test_chat_rendering_uses_the_models_template(tiny_lm):
    prompt = _prompt(chat=True)
    text = prompt.context("it is fine", ("negative", "positive"), tiny_lm.tokenizer)
    assert text.count("<|im_start|>user") == 3 and text.count("<|im_start|>assistant") == 3
    assert text.startswith("<|im_start|>system\nClassify the review.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    assert prompt.continuation("positive") == "positive" and not prompt.add_special_tokens


def test_card_round_trip(tmp_path):
    prompt = _prompt(label_words=("bad", "good"))
    save_card(prompt, tmp_path / "card.yaml", provenance={"model": "m", "seed": 3})
    loaded, provenance = load_card(tmp_path / "card.yaml")
    assert loaded == prompt and provenance == {"model": "m", "seed": 3}


@pytest.mark.parametrize(
    "content, message",
    [
        ("promptopt_card: 9\ntask: x\n", "promptopt_card: expected card version 1 or 2, got 9"),
        ("promptopt_card: 1\n", "task: expected a string, got 'nothing'"),
        ("promptopt_card: 1\ntask: x\ntemplate: {query: '{nope}'}\n", "unknown placeholder {nope}"),
        (
            "promptopt_card: 1\ntask: x\nexemplars: [{question: q, choices: [a], gold: 4}]\n",
            "exemplars[0].gold: expected an index",
        ),
        ("promptopt_card: 1\ntask: x\nextra: 1\n", "extra: unknown key"),
        ("- just a list\n", "expected a mapping at the top level"),
    ],
)
def test_bad_cards(tmp_path, content, message):
    path = tmp_path / "card.yaml"
    path.write_text(content)
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("{", r"\{").replace("}", r"\}")
    ):
        load_card(path)
