"""Answer types: one registry entry per way of asking and judging (lm-eval's output types + filters).

Each type says
- how a data row becomes an `Item` (`make_item`),
- how it is scored: `generative = False` scores each choice's continuation by log-likelihood;
  `generative = True` generates with the task's decoding settings, then extracts and judges (`judge`),
- where its **critical prediction point** is (where δ_TCB, V_eff, margin and local PPL are read):
  log-likelihood types at the position that predicts the first token of the answer; generative types at
  the position that predicts the first token of the extracted answer (`judge` returns where it starts;
  when nothing was extracted the scorer says so instead of reading some other token),
- which continuation the PPL is read on (`gold_continuation`).

Adding a type is one class with `@ANSWER_TYPES.register` (or an entry point in the group
`promptopt.answer_types`, promptopt/registry.py); nothing else branches on type names.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np

from promptopt.errors import ConfigError
from promptopt.registry import Registry
from promptopt.tasks.extract import (
    alias_match,
    answer_is_letter,
    answer_lines,
    choice_answer,
    final_number,
    first_line,
    gsm8k_gold,
    numbers_equal,
    stated_number,
)
from promptopt.tasks.fields import RowRef, missing_column
from promptopt.tasks.item import Item

Judgement = tuple[str, int, bool]  # extracted answer, where it starts in the generated text (-1: none), correct
ANSWER_TYPES: Registry[AnswerType] = Registry(
    "answer type",
    group="promptopt.answer_types",
    builtins={
        "multiple_choice": "promptopt.tasks.answers:MultipleChoice",
        "multiple_choice_gen": "promptopt.tasks.answers:MultipleChoiceGenerated",
        "number": "promptopt.tasks.answers:Number",
        "alias_match": "promptopt.tasks.answers:AliasMatch",
        "code": "promptopt.tasks.answers:Code",
        "exact_match": "promptopt.tasks.exact_match:ExactMatch",  # lm-eval's generate_until + exact_match
    },
    make=lambda cls: cls(),  # a class is registered, its one instance answers
)
register = ANSWER_TYPES.register
EXTRACTIONS = ("default", "answer_line")  # answer.extract: where a generative answer is read (see AnswerType.read)


def get_answer_type(name: str, where: str = "answer.type") -> AnswerType:
    return ANSWER_TYPES.get(name, where)


class AnswerType:
    name: ClassVar[str]
    generative: ClassVar[bool]
    required: ClassVar[tuple[str, ...]] = ("question", "answer")  # fields the task must declare
    has_choices: ClassVar[bool] = False  # items carry choices (and a gold index)

    def make_item(self, spec, ref: RowRef, row: dict) -> Item:
        raise NotImplementedError

    def judge(self, spec, item: Item, text: str, prompt) -> Judgement:
        raise NotImplementedError(f"answer type {self.name} is scored by log-likelihood, not judged")

    def read(self, spec, item: Item, text: str, prompt) -> Judgement:
        """Judge a generation after the task's extraction filter (answer.extract). With `answer_line` (the
        Taboo paper's protocol: chain of thought, then 'Answer: X') the first explicit answer line that states
        an answer is judged (`judge_line`); a text with none is judged by `judge_unstated`."""
        if spec.extract == "answer_line":
            for line, offset in answer_lines(text):
                answer, start, correct = self.judge_line(spec, item, line, prompt)
                if start >= 0:
                    return answer, offset + start, correct
            return self.judge_unstated(spec, item, text, prompt)
        return self.judge(spec, item, text, prompt)

    def judge_line(self, spec, item: Item, line: str, prompt) -> Judgement:
        """Judge the content of an explicit answer line (default: as any generated text)."""
        return self.judge(spec, item, line, prompt)

    def judge_unstated(self, spec, item: Item, text: str, prompt) -> Judgement:
        """Judge a chain of thought that never wrote an answer line (default: the type's own rule)."""
        return self.judge(spec, item, text, prompt)

    def gold_label(self, item: Item) -> Any:
        """What the per-item table shows as `gold`."""
        return item.gold

    def gold_continuation(self, prompt, item: Item) -> str:
        """The answer text whose log-likelihood gives the item's PPL: the gold choice as the prompt shows
        choices (label word, letter or text), else the item's target (e.g. a reference solution)."""
        if item.partial:  # the choices are contexts; what is scored after the gold one is the shared continuation
            return item.continuation
        if item.choices is not None and isinstance(item.gold, int):
            return prompt.choice_texts(item.choices)[item.gold]
        return item.target

    def answer_span(self, prompt, item: Item) -> tuple[str, str]:
        """(reasoning prefix, final answer) inside the gold continuation: the PPL-guided baseline reads the
        NLL of the final answer only, conditioned on the prefix. Default: the whole continuation."""
        return "", self.gold_continuation(prompt, item)

    # --- shared row readers -------------------------------------------------------------------------
    @staticmethod
    def _base(spec, ref: RowRef, row: dict) -> tuple[str, str]:
        fields = spec.fields
        item_id = fields["id"].text(row, ref) if "id" in fields else ref.id
        return item_id, fields["question"].text(row, ref)

    @staticmethod
    def _choices_and_gold(spec, ref: RowRef, row: dict) -> tuple[list[str], int]:
        fields = spec.fields
        choices = fields["choices"].choices(row, ref)
        labels = fields["choice_labels"].choices(row, ref) if "choice_labels" in fields else None
        answer = fields["answer"].target(row, ref)
        if spec.dialect == "lm-eval":
            name = getattr(fields["answer"], "missing_column", lambda row: None)(row)
            if name is not None and answer == name and name not in choices:
                raise ref.fail(
                    fields["answer"].key,
                    f"{missing_column(name, row)}: lm-eval reads a name that is no column as the text '{name}', "
                    f"which is not one of the choices {choices}",
                    f"column '{name}' not found",
                )
            return choices, lm_eval_gold(answer, choices, ref, fields["answer"].key)
        return choices, gold_index(answer, choices, labels, ref, fields["answer"].key)


def lm_eval_gold(value: Any, choices: list[str], ref: RowRef, key: str) -> int:
    """The gold as lm-eval's multiple_choice reads `doc_to_target`: an integer is an index, a text must be one of
    the choices exactly. What lm-eval would score as wrong with a warning (an index out of range, a text that is no
    choice) or read as several golds (a list) is refused here, naming the row."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 0 <= int(value) < len(choices):
            raise ref.fail(key, f"answer index {int(value)} is out of range for {len(choices)} choices", "out of range")
        return int(value)
    if isinstance(value, str):
        if value not in choices:
            raise ref.fail(
                key,
                f"answer {value!r} is not one of the choices {choices} (lm-eval matches the text exactly and would "
                "score the item as wrong)",
                "not a choice",
            )
        return choices.index(value)
    raise ref.fail(
        key,
        f"expected a choice index or text, got {type(value).__name__} {value!r} (lm-eval's multiple targets are not supported)",
    )


def gold_index(value: Any, choices: list[str], labels: list[str] | None, ref: RowRef, key: str) -> int:
    """The gold choice as an index: an integer (or digits), a choice label ('B'), or the choice's text."""
    if isinstance(value, bool):
        index = int(value)
    elif isinstance(value, (int, np.integer)):
        index = int(value)
    elif labels is not None and str(value) in labels:
        index = labels.index(str(value))
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        index = int(value)
    elif isinstance(value, str) and value in choices:
        index = choices.index(value)
    elif isinstance(value, str) and value.strip() in [c.strip() for c in choices]:
        index = [c.strip() for c in choices].index(value.strip())
    else:
        raise ref.fail(
            key, f"answer {value!r} is not a choice index, label or choice text (choices: {choices})", "not a choice"
        )
    if not 0 <= index < len(choices):
        raise ref.fail(key, f"answer index {index} is out of range for {len(choices)} choices", "out of range")
    return index


def check_distinct_choices(spec, ref: RowRef, row: dict, choices: list[str]) -> None:
    """Two equal choices cannot be told apart (the first would win every tie, so a gold on either scores
    right): an error naming where the choices come from, unless the task allows duplicates."""
    from promptopt.tasks.fields import lookup
    from promptopt.yamlio import key_line

    seen = set()
    dup = next((c for c in choices if c in seen or seen.add(c)), None)
    if dup is None:
        return
    field = spec.fields["choices"]
    fix = (
        "make the choices distinct, or set answer.allow_duplicate_choices: true to allow them "
        "(a tie between equal choices then counts as wrong)"
    )
    literal = field.kind == "list" and all(e.kind == "column" and not lookup(row, e.raw)[0] for e in field.entries)
    if literal:  # the words are the task file's, the same in every row
        line = key_line(spec.where, field.key)
        raise ConfigError(
            f"{spec.where}{f' line {line}' if line else ''}: {field.key}: choice '{dup}' appears twice {choices}; {fix}"
        )
    raise ref.fail(field.key, f"choice '{dup}' appears twice {choices}; {fix}", "a choice twice")


class MultipleChoice(AnswerType):
    """Each choice's continuation scored by log-likelihood (lm-eval's acc; acc_norm divides by length)."""

    name = "multiple_choice"
    generative = False
    required = ("question", "choices", "answer")
    has_choices = True

    def make_item(self, spec, ref, row):
        fields = spec.fields
        item_id = fields["id"].text(row, ref) if "id" in fields else ref.id
        question = fields["question"].text_or_index(row, ref)
        if isinstance(question, int):
            return self._partial(spec, ref, row, item_id, question)
        choices, gold = self._choices_and_gold(spec, ref, row)
        if not spec.allow_duplicate_choices:
            check_distinct_choices(spec, ref, row, choices)
        return Item(item_id, question, gold, choices[gold], tuple(choices), where=ref.where)

    def _partial(self, spec, ref, row, item_id: str, gold: int) -> Item:
        """lm-eval's multiple inputs (Winogrande): doc_to_text gives the answer index, doc_to_choice the alternative
        contexts and doc_to_target the continuation scored after each of them."""
        fields = spec.fields
        contexts = fields["choices"].choices(row, ref)
        if not 0 <= gold < len(contexts):
            raise ref.fail(
                fields["question"].key,
                f"answer index {gold} (the task's choices are contexts, so doc_to_text gives the gold's index) is out "
                f"of range for {len(contexts)} choices",
                "out of range",
            )
        if "choice_labels" in fields:
            raise ref.fail(
                fields["choice_labels"].key, "choice labels do not apply when the choices are contexts", "labels"
            )
        continuation = fields["answer"].text(row, ref)
        if not spec.allow_duplicate_choices:
            check_distinct_choices(spec, ref, row, contexts)
        return Item(
            item_id, contexts[gold], gold, continuation, tuple(contexts), where=ref.where, continuation=continuation
        )


class MultipleChoiceGenerated(MultipleChoice):
    """The model writes its choice (a letter or the option's text), which is extracted and judged: how chat
    models answer, and what taboo stress needs for multiple-choice tasks."""

    name = "multiple_choice_gen"
    generative = True

    def _partial(self, spec, ref, row, item_id, gold):
        raise ref.fail(
            spec.fields["question"].key,
            f"gives an answer index ({gold}): choices that are contexts (lm-eval's multiple inputs) are scored by "
            "log-likelihood, so only answer.type multiple_choice takes them",
            "partial",
        )

    def judge(self, spec, item, text, prompt):
        shown = options = prompt.choice_texts(item.choices)
        index, start = choice_answer(text, shown)
        if index is None and shown != list(item.choices):  # letters or label words shown: the text counts too
            options = list(item.choices)
            index, start = choice_answer(text, options)
        if index is None:
            return "", -1, False
        return shown[index], start, index == item.gold and options.count(options[index]) == 1  # a tie is wrong

    def judge_unstated(self, spec, item, text, prompt):
        """Without an answer line only 'the answer is X' counts: a chain of thought starts with capitals ('A
        square is ...') that the short-answer rules would read as a choice, crediting a derailed output."""
        shown = prompt.choice_texts(item.choices)
        index, start = answer_is_letter(text, len(shown))
        if index is None:
            return "", -1, False
        return shown[index], start, index == item.gold


class Number(AnswerType):
    """A final number (GSM8K's '#### N', 'the answer is N', else the last number), compared numerically."""

    name = "number"
    generative = True

    def make_item(self, spec, ref, row):
        fields = spec.fields
        item_id, question = self._base(spec, ref, row)
        if "choices" in fields:  # e.g. basic_arithmetic: the gold is the text of the keyed choice
            choices, gold = self._choices_and_gold(spec, ref, row)
            answer = choices[gold]
        else:
            answer = fields["answer"].text(row, ref)
        target = fields["target"].text(row, ref) if "target" in fields else None
        if spec.gold_format == "gsm8k":
            try:
                gold = gsm8k_gold(answer)
            except ValueError:
                raise ref.fail(fields["answer"].key, "answer has no '#### N'") from None
            solution = re.sub(r"<<[^>]*>>", "", answer)  # drop calculator annotations from shown solutions
            return Item(item_id, question, gold, target or solution, where=ref.where)
        return Item(item_id, question, answer.strip(), target or answer.strip(), where=ref.where)

    def answer_span(self, prompt, item):
        target = item.target
        if "####" in target:  # GSM8K-style reference: the reasoning, then '#### N'
            cut = target.rindex("####") + 4
            return target[:cut] + " ", target[cut:].strip()
        value, start = final_number(target)
        if value is not None and start > 0:
            return target[:start], target[start:]
        return "", target

    def judge(self, spec, item, text, prompt):
        value, start = final_number(text)
        return value or "", start, numbers_equal(value, item.gold)

    def judge_line(self, spec, item, line, prompt):
        value, start = stated_number(line)
        return value or "", start, numbers_equal(value, item.gold)


class AliasMatch(AnswerType):
    """A short answer (the first line) matched against the gold aliases after SQuAD normalization."""

    name = "alias_match"
    generative = True

    def make_item(self, spec, ref, row):
        fields = spec.fields
        item_id, question = self._base(spec, ref, row)
        answer = fields["answer"].resolve(row, ref)
        aliases = tuple(str(a) for a in (answer if isinstance(answer, (list, tuple)) else [answer]) if a is not None)
        if not aliases:
            raise ref.fail(fields["answer"].key, "no answer aliases")
        target = fields["target"].text(row, ref) if "target" in fields else aliases[0]
        return Item(item_id, question, aliases, target, where=ref.where)

    def judge(self, spec, item, text, prompt):
        answer, start = first_line(text)
        return answer, start, alias_match(answer, item.gold)


class Code(AnswerType):
    """A completion run against the item's unit tests in the code sandbox (passed = exit status 0)."""

    name = "code"
    generative = True
    required = ("question", "answer", "test", "entry_point")

    def make_item(self, spec, ref, row):
        fields = spec.fields
        item_id, question = self._base(spec, ref, row)
        meta = {"entry_point": fields["entry_point"].text(row, ref)}
        test = fields["test"].text(row, ref)
        target = fields["target"].text(row, ref) if "target" in fields else fields["answer"].text(row, ref)
        return Item(item_id, question, test, target, None, meta, where=ref.where)

    def gold_label(self, item):
        return item.meta["entry_point"]  # the test program itself is too long to show

    def judge(self, spec, item, text, prompt):
        from promptopt.tasks.sandbox import run_python

        program = f"{item.question}{text}\n\n{item.gold}\n\ncheck({item.meta['entry_point']})\n"
        result = run_python(program, timeout=spec.code_timeout)
        start = len(text) - len(text.lstrip())
        return result.status, start, result.passed
