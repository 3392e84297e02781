"""A prompt = instruction + ordered exemplars + template, rendered to text (plain) or chat messages.

The prompt card is the one on-disk form of a prompt: `score` reads it, `search` writes it, `export` adds
provenance to it. It carries the exemplars' text, not just their ids, so production code can load it
without the dataset and reproduce the score.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from promptopt.errors import ConfigError
from promptopt.yamlio import Fields, atomic_write_text, load_yaml

CARD_VERSION = 1
LETTERS = string.ascii_uppercase
_PLACEHOLDERS = {"question", "options", "answer"}


@dataclass(frozen=True)
class PromptTemplate:
    """How one item becomes text.

    query: the item; placeholders {question} and {options} (letter-style choice list).
    exemplar: an exemplar; defaults to query + answer_delimiter + {answer}, so shots and query agree.
    label_words: words that replace the item's choices (e.g. SST-2's " negative"/" positive" variants).
    choice_format: "text" scores each choice's text; "letter" lists options and scores " A", " B", ...
    """

    query: str = "{question}"
    exemplar: str | None = None
    separator: str = "\n\n"
    answer_delimiter: str = " "
    label_words: tuple[str, ...] | None = None
    choice_format: str = "text"
    chat: bool = False
    name: str = "default"

    def validate(self, where: str) -> None:
        for key in ("query", "exemplar"):
            text = getattr(self, key)
            if text is None:
                continue
            try:
                names = {f[1] for f in string.Formatter().parse(text) if f[1] is not None}
            except ValueError as exc:
                raise ConfigError(f"{where}: template.{key}: invalid format string ({exc})") from None
            unknown = names - _PLACEHOLDERS
            if unknown:
                raise ConfigError(
                    f"{where}: template.{key}: unknown placeholder {{{sorted(unknown)[0]}}} "
                    f"(allowed: {', '.join('{' + p + '}' for p in sorted(_PLACEHOLDERS))})"
                )
        if self.choice_format not in ("text", "letter"):
            raise ConfigError(f"{where}: template.choice_format: expected text or letter, got {self.choice_format!r}")

    @classmethod
    def from_dict(cls, data: dict, where: str) -> PromptTemplate:
        f = Fields(data, where, "template")
        f.reject_unknown(
            {"query", "exemplar", "separator", "answer_delimiter", "label_words", "choice_format", "chat", "name"}
        )
        words = f.get("label_words", list, None)
        if words is not None and not all(isinstance(w, str) and w for w in words):
            raise f.fail("label_words", "a list of non-empty strings", words)
        template = cls(
            query=f.get("query", str, "{question}"),
            exemplar=f.get("exemplar", str, None),
            separator=f.get("separator", str, "\n\n"),
            answer_delimiter=f.get("answer_delimiter", str, " "),
            label_words=tuple(words) if words else None,
            choice_format=f.choice("choice_format", ("text", "letter"), "text"),
            chat=f.get("chat", bool, False),
            name=f.get("name", str, "default"),
        )
        template.validate(where)
        return template

    def to_dict(self) -> dict:
        data = asdict(self)
        data["label_words"] = list(self.label_words) if self.label_words else None
        return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True)
class Exemplar:
    """One worked example shown before the query: its question, choices (MC) and answer."""

    id: str
    question: str
    answer: str  # the target text (solution for generative tasks; ignored for MC when gold is set)
    choices: tuple[str, ...] | None = None
    gold: int | None = None  # index into choices, for multiple choice


@dataclass(frozen=True)
class Prompt:
    task: str
    instruction: str = ""
    exemplars: tuple[Exemplar, ...] = ()
    template: PromptTemplate = field(default_factory=PromptTemplate)
    # how a choice task's answer is decided from its label log-probabilities (promptopt/decision.py): argmax, or
    # a calibrated rule's name, whose parameters are fit on dev items (an exported card holds them)
    decision: str = "argmax"

    # --- pieces --------------------------------------------------------------------------------
    def choice_texts(self, choices: tuple[str, ...] | None) -> list[str]:
        """What is scored for each choice: label words, letters, or the choice text itself."""
        if choices is None:
            return []
        if self.template.choice_format == "letter":
            return [LETTERS[i] for i in range(len(choices))]
        if self.template.label_words:
            if len(self.template.label_words) != len(choices):
                raise ConfigError(
                    f"prompt for task {self.task}: template.label_words has {len(self.template.label_words)} "
                    f"words but items have {len(choices)} choices"
                )
            return list(self.template.label_words)
        return list(choices)

    def _options(self, choices: tuple[str, ...] | None) -> str:
        if not choices:
            return ""
        return "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))

    def query_text(self, question: str, choices: tuple[str, ...] | None = None) -> str:
        return self.template.query.format(question=question, options=self._options(choices), answer="")

    def exemplar_answer(self, ex: Exemplar) -> str:
        if ex.gold is not None and ex.choices is not None:
            return self.choice_texts(ex.choices)[ex.gold]
        return ex.answer

    def exemplar_text(self, ex: Exemplar) -> str:
        answer = self.exemplar_answer(ex)
        if self.template.exemplar is not None:
            return self.template.exemplar.format(question=ex.question, options=self._options(ex.choices), answer=answer)
        return self.query_text(ex.question, ex.choices) + self.template.answer_delimiter + answer

    # --- rendering -----------------------------------------------------------------------------
    def messages(self, question: str, choices: tuple[str, ...] | None = None) -> list[dict[str, str]]:
        """Chat form: instruction as system turn, each exemplar as a user/assistant pair, then the query."""
        msgs = [{"role": "system", "content": self.instruction}] if self.instruction else []
        for ex in self.exemplars:
            msgs.append({"role": "user", "content": self.query_text(ex.question, ex.choices)})
            msgs.append({"role": "assistant", "content": self.exemplar_answer(ex)})
        msgs.append({"role": "user", "content": self.query_text(question, choices)})
        return msgs

    def context(self, question: str, choices: tuple[str, ...] | None = None, tokenizer: Any = None) -> str:
        """The full text the model reads before answering (chat templates need the tokenizer)."""
        if self.template.chat:
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                raise ConfigError(
                    f"prompt for task {self.task}: template.chat is true but the model has no chat template"
                )
            return tokenizer.apply_chat_template(
                self.messages(question, choices), tokenize=False, add_generation_prompt=True
            )
        parts = [self.instruction] if self.instruction else []
        parts += [self.exemplar_text(ex) for ex in self.exemplars]
        parts.append(self.query_text(question, choices))
        return self.template.separator.join(parts)

    def continuation(self, answer: str) -> str:
        """The scored continuation for an answer text (chat answers start right after the assistant tag)."""
        return answer if self.template.chat else self.template.answer_delimiter + answer

    @property
    def add_special_tokens(self) -> bool:
        """Plain text gets the tokenizer's BOS; a chat template already wrote its own."""
        return not self.template.chat

    # --- the card ------------------------------------------------------------------------------
    def to_card(self, provenance: dict | None = None) -> dict:
        card = {
            "promptopt_card": CARD_VERSION,
            "task": self.task,
            "instruction": self.instruction,
            "template": self.template.to_dict(),
            "exemplars": [{k: v for k, v in asdict(ex).items() if v is not None} for ex in self.exemplars],
        }
        for ex in card["exemplars"]:
            if "choices" in ex:
                ex["choices"] = list(ex["choices"])
        if self.decision != "argmax":  # argmax prompts keep the cards (and hashes) they always had
            card["decision"] = self.decision
        if provenance:
            card["provenance"] = provenance
        return card

    @property
    def characters(self) -> int:
        """Characters the model reads per input besides the input itself (instruction, exemplars, the query's
        template): what a card costs to serve, before its decision rule and members (selection's `cost`)."""
        return sum(len(m["content"]) for m in self.messages("", None))

    def with_(self, **changes) -> Prompt:
        return replace(self, **changes)


def save_card(prompt: Prompt, path: str | Path, provenance: dict | None = None) -> None:
    text = yaml.safe_dump(prompt.to_card(provenance), sort_keys=False, allow_unicode=True, width=1000)
    atomic_write_text(path, text)


def load_card(path: str | Path) -> tuple[Prompt, dict]:
    """Read a prompt card -> (Prompt, provenance). Every field is validated; errors name file and key.

    Version 1: provenance is the card's free-form mapping. Version 2 (written by `promptopt export`,
    schema in promptopt/card_schema.json): the same mapping's keys (model spec, strategy, study, trial,
    seed, dev, test) plus the whole card under `card`."""
    where = str(path)
    data = load_yaml(path)
    f = Fields(data, where)
    version = f.get("promptopt_card", int, expected=f"card version {CARD_VERSION} or 2")
    if version == 2:
        from promptopt.card import v1_view, validate_card

        validate_card(data, where)
        return prompt_from_card(data, where), v1_view(data)
    f.reject_unknown({"promptopt_card", "task", "instruction", "template", "exemplars", "decision", "provenance"})
    if version != CARD_VERSION:
        raise f.fail("promptopt_card", f"card version {CARD_VERSION} or 2", version)
    return prompt_from_card(data, where), f.get("provenance", dict, {})


def prompt_from_card(data: dict, where: str) -> Prompt:
    """The prompt fields of a card mapping (task, instruction, template, exemplars) -> Prompt."""
    f = Fields(data, where)
    template = PromptTemplate.from_dict(f.get("template", dict, {}), where)
    exemplars = []
    for i, raw in enumerate(f.get("exemplars", list, [])):
        e = Fields(raw, where, f"exemplars[{i}]")
        e.reject_unknown({"id", "question", "answer", "choices", "gold"})
        choices = e.get("choices", list, None)
        gold = e.get("gold", int, None)
        if gold is not None and (choices is None or not 0 <= gold < len(choices)):
            raise e.fail("gold", "an index into choices", gold)
        exemplars.append(
            Exemplar(
                id=str(e.get("id", (str, int), f"ex{i}")),
                question=e.get("question", str),
                answer=e.get("answer", str, ""),
                choices=tuple(str(c) for c in choices) if choices is not None else None,
                gold=gold,
            )
        )
    return Prompt(
        task=f.get("task", str),
        instruction=f.get("instruction", str, ""),
        exemplars=tuple(exemplars),
        template=template,
        decision=_decision_name(data.get("decision"), where),
    )


def _decision_name(value, where: str) -> str:
    """A card's decision: a rule's name (search cards) or its fitted mapping (exported cards) -> the name."""
    from promptopt.decision import parse_rule, rule_from_card

    if value is None:
        return "argmax"
    if isinstance(value, str):
        parse_rule(value)  # a typo fails here, naming the rule
        return value
    rule = rule_from_card(value, f"{where}: decision")
    return f"{rule.name}:{rule.reading}" if rule.calibrated else "argmax"
