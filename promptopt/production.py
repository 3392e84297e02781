"""`promptopt.load_prompt(card)`: a prompt card for production code — render, chat messages, parse.

Imports neither torch nor transformers (nor numpy): only the stdlib, yaml, jsonschema (the card is
validated on load) and, for chat cards, jinja2. What it renders is byte for byte the text the scorer
scored: plain cards join instruction, exemplars and query exactly as `Prompt.context` does; chat cards
carry the model's chat template and the special tokens it saw, and are rendered here with the same
sandboxed Jinja settings transformers' `apply_chat_template` uses. `parse` is the task's own answer
extraction (promptopt/tasks/extract.py), so production reads answers the way the search judged them.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from promptopt.errors import ConfigError
from promptopt.prompts import Prompt, prompt_from_card
from promptopt.yamlio import Fields, load_yaml

_CHOICE_TYPES = ("multiple_choice", "multiple_choice_gen")


@dataclass(frozen=True, kw_only=True)
class CardPrompt:
    """A loaded card. `prompt` is the plain Prompt; `card` the whole mapping (metrics, fingerprints)."""

    prompt: Prompt
    card: dict
    where: str = ""
    _template: Any = field(default=None, repr=False, compare=False)  # compiled chat template

    # --- what the card says -------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return int(self.card["promptopt_card"])

    @property
    def task(self) -> str:
        return self.prompt.task

    @property
    def chat(self) -> bool:
        return self.prompt.template.chat

    @property
    def answer_type(self) -> str | None:
        return (self.card.get("answer") or {}).get("type")

    @property
    def choices(self) -> tuple[str, ...] | None:
        """The task's fixed choices (e.g. negative/positive), the default of render() and parse()."""
        fixed = (self.card.get("answer") or {}).get("choices")
        return tuple(fixed) if fixed else None

    @property
    def generation(self) -> dict | None:
        """Decoding settings for generative tasks: max_new_tokens, stop (greedy)."""
        return self.card.get("generation")

    @property
    def add_special_tokens(self) -> bool:
        """Pass this to the tokenizer when encoding render()'s text: plain text gets the tokenizer's BOS,
        a chat template already wrote its own."""
        return self.prompt.add_special_tokens

    @property
    def metrics(self) -> dict:
        return self.card.get("metrics") or {}

    # --- deciding (choice tasks) ----------------------------------------------------------------------
    @property
    def decision(self):
        """The card's decision rule (promptopt.decision.DecisionRule; argmax when the card names none)."""
        from promptopt.decision import rule_from_card

        return rule_from_card(self.card.get("decision"), f"{self.where}: decision")

    @property
    def members(self) -> list[CardPrompt]:
        """The prompts whose answers the card combines: an ensemble card's K members, else [self]."""
        ensemble = self.card.get("ensemble")
        if not ensemble:
            return [self]
        base = {k: v for k, v in self.card.items() if k != "ensemble"}
        out = []
        for i, member in enumerate(ensemble["members"]):
            data = {**base, **{k: member[k] for k in ("instruction", "template", "exemplars")}}
            data["decision"] = member.get("decision")
            out.append(
                card_prompt({k: v for k, v in data.items() if v is not None}, f"{self.where}: ensemble.members[{i}]")
            )
        return out

    def _member_scores(
        self, member: CardPrompt, rows: list[list[float]], choices: list, content_free: list | None = None
    ) -> list[list[float]]:
        from promptopt.decision import reference_row

        rule = member.decision
        refs = None
        if rule.per_item:
            if content_free is None:
                raise ConfigError(
                    f"{member.where}: decision pmi: pass content_free= (per input, the log-likelihoods of "
                    "content_free_requests(choices), in order)"
                )
            refs = []
            for flat, row in zip(content_free, rows, strict=True):
                k = len(row)
                flat = [float(v) for v in flat]
                if len(flat) != k * len(rule.content_free):
                    raise ConfigError(
                        f"{member.where}: decision pmi: {len(flat)} content-free log-likelihoods for {k} choices "
                        f"× {len(rule.content_free)} content-free inputs"
                    )
                refs.append(reference_row([flat[j * k : (j + 1) * k] for j in range(len(rule.content_free))]))
        if rule.reading == "acc_norm":  # lm-eval's acc_norm: per character of what is scored for each choice
            lengths = [[len(t) for t in member.choice_texts(c)] for c in choices]
            rows = [[v / n for v, n in zip(r, ln)] for r, ln in zip(rows, lengths, strict=True)]
            if refs is not None:
                refs = [[v / n for v, n in zip(r, ln)] for r, ln in zip(refs, lengths)]
        biases = rule.biases(rows, refs)
        return [rule.scores(r, b) for r, b in zip(rows, biases)]

    def decide_batch(self, logprobs: list, choices: list | None = None, content_free: list | None = None) -> list[int]:
        """The chosen choice index for each input of a batch, by the card's rule. `logprobs[i]`: input i's
        log-likelihood of each continuation (summed over its tokens, as `continuations()` gives them) — for an
        ensemble card, one such list per member (`members`, each rendered by its own `render`). `choices[i]`:
        input i's choices (needed by per-item choice tasks; default: the card's fixed ones). An adaptive batch
        rule re-estimates its bias from the batch, as the scorer does. `content_free[i]` (a `pmi` card): the
        log-likelihoods of `content_free_requests(choices[i])`, in order (per member for an ensemble card) —
        the same for every input with the same choices, so cache them per choice tuple.

        Args:
            logprobs: per input, each continuation's log-likelihood (per member, for an ensemble card).
            choices: per input, its choices; None: the card's fixed ones.
            content_free: per input, the log-likelihoods of `content_free_requests` (a `pmi` card only).

        Returns:
            The chosen choice index of each input.

        Raises:
            ConfigError: an ensemble card given one list per input, or a per-item task without its choices.
        """
        from promptopt.decision import argmax, ensemble_scores

        choices = [self._choices(None)] * len(logprobs) if choices is None else [self._choices(c) for c in choices]
        members = self.members
        if len(members) == 1:
            rows = [list(r) for r in logprobs]
            return [argmax(s) for s in self._member_scores(self, rows, choices, content_free)]
        if any(len(row) != len(members) for row in logprobs):
            raise ConfigError(
                f"{self.where}: an ensemble card needs one log-probability list per member ({len(members)})"
            )
        per_member = [
            self._member_scores(
                m,
                [list(row[k]) for row in logprobs],
                choices,
                None if content_free is None else [row[k] for row in content_free],
            )
            for k, m in enumerate(members)
        ]
        return [argmax(ensemble_scores([scores[i] for scores in per_member])) for i in range(len(logprobs))]

    def decide(
        self, logprobs: list, choices: list[str] | tuple[str, ...] | None = None, content_free: list | None = None
    ) -> int:
        """One input's chosen choice index (a batch of one: an adaptive rule keeps its stored bias).

        Args:
            logprobs: each continuation's log-likelihood (one list per member for an ensemble card).
            choices: the input's choices; None: the card's fixed ones.
            content_free: the log-likelihoods of `content_free_requests(choices)` (a `pmi` card only).

        Returns:
            The index of the chosen choice.
        """
        return self.decide_batch(
            [logprobs], None if choices is None else [choices], None if content_free is None else [content_free]
        )[0]

    def content_free_requests(self, choices=None) -> list[tuple[str, str]]:
        """A `pmi` card: the (context, continuation) texts whose log-likelihoods `decide`'s content_free takes, for
        one input's choices — each of the card's content-free inputs rendered in place of the question, followed by
        each continuation. The context is the same for every input, so the log-likelihoods can be cached per
        (card, choice text). Score them as `continuations()` are scored; an empty context is scored after the
        tokenizer's BOS (EOS where it has none), as lm-eval scores its unconditional requests. Empty for other rules."""
        rule = self.decision
        if not rule.per_item:
            return []
        conts = self.continuations(choices)
        return [(self.render(text, choices), cont) for text in rule.content_free for cont in conts]

    # --- rendering ----------------------------------------------------------------------------------
    def _choices(self, choices) -> tuple[str, ...] | None:
        return tuple(choices) if choices is not None else self.choices

    def messages(self, question: str, choices=None) -> list[dict[str, str]]:
        """OpenAI-style chat messages: instruction as the system turn, each exemplar a user/assistant pair."""
        return self.prompt.messages(question, self._choices(choices))

    def render(self, question: str, choices: list[str] | tuple[str, ...] | None = None) -> str:
        """Exactly the text the scorer scored for this question (and choices, for multiple choice).

        Args:
            question: the input, as the task's question field holds it.
            choices: the input's choices; None: the card's fixed ones (if any).

        Returns:
            The prompt text, byte for byte; for a chat card, rendered through the card's recorded chat template.

        Raises:
            ConfigError: a chat card without its chat template (a version-1 card).
        """
        choices = self._choices(choices)
        if not self.chat:
            return self.prompt.context(question, choices)
        if self._template is None:
            raise ConfigError(
                f"{self.where}: template.chat is true but the card has no rendering.chat_template "
                "(a version-1 card): re-export it with `promptopt export`"
            )
        variables = dict((self.card.get("rendering") or {}).get("template_vars") or {})
        return self._template.render(
            messages=self.messages(question, choices),
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **variables,
        )

    def choice_texts(self, choices=None) -> list[str]:
        """What is shown and scored for each choice: label words, letters or the choice texts."""
        return self.prompt.choice_texts(self._choices(choices))

    def continuations(self, choices: list[str] | tuple[str, ...] | None = None) -> list[str]:
        """Per choice, the text whose log-likelihood after render() scores it (multiple choice). Without
        choices it needs the card's fixed ones: a task whose items each have their own (ARC, MMLU) would
        otherwise get an empty list, and an argmax over nothing.

        Args:
            choices: the input's choices; None: the card's fixed ones.

        Returns:
            One continuation per choice, in the choices' order.

        Raises:
            ConfigError: no choices given and the card has no fixed ones.
        """
        choices = self._choices(choices)
        if choices is None:
            raise ConfigError(
                f"{self.where}: task {self.task} has no fixed choices (each item has its own): "
                "pass the item's choices, continuations(item.choices)"
            )
        return [self.prompt.continuation(text) for text in self.choice_texts(choices)]

    # --- reading answers ----------------------------------------------------------------------------
    def parse_index(self, model_output: str, choices=None) -> int | None:
        """Multiple choice: the index of the choice a generated answer names (the judge's extraction:
        'the answer is X', a leading letter, the option's label word or text), or None."""
        from promptopt.tasks.extract import choice_answer

        self._need_type()
        if self.answer_type not in _CHOICE_TYPES:
            raise ConfigError(
                f"{self.where}: answer.type is {self.answer_type}: parse_index is for multiple-choice cards"
            )
        choices = self._choices(choices)
        if choices is None:
            raise ConfigError(f"{self.where}: the card records no fixed choices (answer.choices): pass choices=")
        shown = self.prompt.choice_texts(choices)
        index, _ = choice_answer(model_output, shown)
        if index is None and shown != list(choices):  # letters or label words shown: the text counts too
            index, _ = choice_answer(model_output, list(choices))
        return index

    def parse(self, model_output: str, choices: list[str] | tuple[str, ...] | None = None) -> str | None:
        """The answer in a model's output, read as the task's judge reads it: multiple choice → the choice
        (label word → its label); number → the final number, normalized; alias_match → the first line;
        code → the completion itself. None when nothing can be extracted.

        Args:
            model_output: the generated text.
            choices: the input's choices (multiple choice); None: the card's fixed ones.

        Returns:
            The answer as the task's judge reads it, or None.

        Raises:
            ConfigError: a version-1 card (no answer type), or a multiple-choice card without choices.
        """
        from promptopt.tasks.extract import final_number, first_line

        kind = self._need_type()
        if kind in _CHOICE_TYPES:
            index = self.parse_index(model_output, choices)
            return None if index is None else self._choices(choices)[index]
        if kind == "number":
            return final_number(model_output)[0]
        if kind == "alias_match":
            return first_line(model_output)[0] or None
        return model_output  # code: judged by running it against the tests

    def _need_type(self) -> str:
        if self.answer_type is None:
            raise ConfigError(
                f"{self.where}: a version-1 card records no answer type: re-export it with `promptopt export`"
            )
        return self.answer_type


class UncheckedCardWarning(UserWarning):
    """A card loaded with `load_prompt(path, check=False)`: its hashes were not compared, so an edit goes unnoticed."""


def load_prompt(path: str | Path, *, check: bool = True) -> CardPrompt:
    """Load a prompt card (version 2, validated against promptopt/card_schema.json). Errors are one ConfigError naming
    the file and the field.

    `check` (default): the card must be as exported — its prompt fields match check.prompt_sha256 and every other
    field that decides its answers (rendering, decision, model, data, ...) check.fields_sha256 — else it is refused,
    naming the edited fields; a card without check.fields_sha256 (deleted, or exported before promptopt wrote it) and
    a version-1 card (no hashes; renders plain prompts only) cannot be checked and are refused too. `check=False`
    loads any valid card as it is and says so with an UncheckedCardWarning on every load.

    Args:
        path: the card's YAML file.
        check: refuse a card whose hashes do not match what export wrote (False: load it, with a warning).

    Returns:
        The card, ready to render inputs, decide answers from log-likelihoods and parse model outputs.

    Raises:
        ConfigError: the file is missing or malformed, a field is invalid, the card was edited after export (or
            cannot be checked), or it needs a decision rule whose package is not installed (the line names it).
    """
    where = str(path)
    data = load_yaml(path)
    version = Fields(data, where).get("promptopt_card", int, expected="card version 1 or 2")
    if version == 2:
        from promptopt.card import validate_card

        validate_card(data, where)
    elif version != 1:
        raise ConfigError(f"{where}: promptopt_card: expected card version 1 or 2, got {version!r}")
    if check:
        _refuse_unchecked(data, where, version)
    else:
        warnings.warn(
            f"{where}: loaded WITHOUT checking its hashes (load_prompt(check=False)): "
            "a card edited after export is used as it is",
            UncheckedCardWarning,
            stacklevel=2,
        )
    return card_prompt(data, where)


def _refuse_unchecked(data: dict, where: str, version: int) -> None:
    """A card that is not as exported, or that cannot be checked, as one ConfigError naming why."""
    from promptopt.card import edited_fields, edited_scored_fields

    unchecked = "export it again, or load_prompt(path, check=False) loads it unchecked"
    if version == 1:
        raise ConfigError(f"{where}: a version-1 card records no hashes, so edits cannot be found: {unchecked}")
    scored = edited_scored_fields(data)
    if scored is None:
        raise ConfigError(
            f"{where}: check.fields_sha256: missing (deleted, or a card exported before promptopt wrote it), so an edit "
            f"of its rendering, decision, model or data cannot be found: {unchecked}"
        )
    edited = edited_fields(data) + scored
    if edited:
        raise ConfigError(
            f"{where}: {', '.join(edited)} edited after export: load_prompt refuses the card ({unchecked})"
        )


def card_prompt(data: dict, where: str = "<card>") -> CardPrompt:
    """A CardPrompt from a card mapping that has been validated (or built by export).

    Args:
        data: the card as a mapping (what `load_prompt` read from YAML).
        where: how errors name the card.

    Returns:
        The card's prompt, unchecked: `load_prompt` is the way to read a card from a file.
    """
    prompt = prompt_from_card(
        {k: data[k] for k in ("task", "instruction", "template", "exemplars") if k in data}, where
    )
    chat_template = (data.get("rendering") or {}).get("chat_template")
    try:
        compiled = _compile_chat_template(chat_template) if prompt.template.chat and chat_template else None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return CardPrompt(prompt=prompt, card=data, where=where, _template=compiled)


@lru_cache(maxsize=8)
def _compile_chat_template(text: str):
    """The chat template compiled as transformers compiles it (apply_chat_template): a sandboxed,
    immutable Jinja environment with trim_blocks/lstrip_blocks, loop controls, its tojson filter and
    raise_exception / strftime_now globals; `{% generation %}` blocks render their body."""
    from datetime import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"rendering.chat_template: invalid Jinja (line {exc.lineno}): {exc.message}") from None


def __getattr__(name: str):
    """`promptopt.production.Server`, deprecated: the runtime lives in `promptopt.serving` (above this module, which
    must not import it back); the old path gives it with a DeprecationWarning until the next release."""
    if name == "Server":
        import importlib
        import warnings

        warnings.warn(
            "promptopt.production.Server moved to promptopt.serving.Server; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("promptopt.serving").Server
    raise AttributeError(f"module 'promptopt.production' has no attribute {name!r}")


__all__ = ["CardPrompt", "UncheckedCardWarning", "card_prompt", "load_prompt"]
