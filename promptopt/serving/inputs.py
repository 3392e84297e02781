"""What a request may ask, checked before anything is scored: one input or a batch of inputs, each a question
(and, for a task whose items have their own choices, its choices), within the server's limits. Every problem is
one `InputError` naming the field and what was expected, with the HTTP status it answers as.

Pure Python: the HTTP app and library callers of `Server.answer` check inputs the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from promptopt.errors import UserError

MAX_NUMBER_CHARS = 100  # characters of one JSON number: no field takes a number, and int() of 4,300+ digits fails


class InputError(UserError):
    """A bad request: the message names the field; `status` is the HTTP status it is answered with (400 malformed,
    413 over a size limit, 422 well-formed but not answerable, e.g. longer than the model's context)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """How much one request may ask (the HTTP app also bounds the body's bytes and the request rate)."""

    max_inputs: int = 32  # inputs per request (a request fits one batch of the HTTP app)
    max_chars: int = 8_000  # characters of one question (the model's context is checked after rendering)
    max_choices: int = 26  # choices of one input
    max_choice_chars: int = 1_000  # characters of one choice

    def __post_init__(self) -> None:
        for name in ("max_inputs", "max_chars", "max_choices", "max_choice_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")


@dataclass(frozen=True)
class Input:
    """One input: the question text and, where the task's items each have their own, the choices."""

    question: str
    choices: tuple[str, ...] | None = None


_INPUT_KEYS = ("question", "choices")


def _type(value) -> str:
    return (
        "null"
        if value is None
        else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
            type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
        )
    )


def _quoted(text: str, limit: int = 40) -> str:
    """A short, ASCII-safe quotation of client text for an error message (lone surrogates escaped)."""
    return ascii(text[:limit] + ("..." if len(text) > limit else ""))


def _no_duplicates(pairs: list) -> dict:
    keys = set()
    for key, _ in pairs:
        if key in keys:
            raise InputError(f"request body: the key {_quoted(key)} appears twice in one object")
        keys.add(key)
    return dict(pairs)


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise InputError(f"request body: a number of {len(text):,} characters (at most {MAX_NUMBER_CHARS})")
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise InputError(f"request body: a number of {len(text):,} characters (at most {MAX_NUMBER_CHARS})")
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise InputError(f"request body: the number {_quoted(text)} is out of range")
    return value


def _no_constant(name: str):
    raise InputError(f"request body: {name} is not JSON (numbers must be finite)")


def _field(path: tuple) -> str:
    """A JSON path as the other errors name fields: `request.question`, `inputs[2].choices[0]`."""
    if not path:
        return "request body"
    out = "" if path[0] == "inputs" else "request"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{_quoted(part)[1:-1]}"
    return out.lstrip(".")


def _unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(
            f"{where}: a lone surrogate ({ascii(text[exc.start])[1:-1]}) at character {exc.start}; "
            "expected Unicode text"
        ) from None


def _check_text(value, path: tuple) -> None:
    """Every string (keys included) must be Unicode text: JSON's \\uD800-style escapes can spell a lone surrogate,
    which no tokenizer takes and UTF-8 cannot encode. Iterative: the parser already bounded the depth."""
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _unicode(value, _field(path))
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, path))
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, k)) for k, item in enumerate(value))


def parse_json_body(body: bytes):
    """A request body -> its JSON value, strictly: UTF-8, no duplicate keys (json would keep the last silently),
    no NaN/Infinity, numbers of at most MAX_NUMBER_CHARS characters and finite, no lone surrogates in any string.
    Every problem is one 400 InputError, so nothing odd reaches the batcher."""
    if not body.strip():
        raise InputError("request body: empty; expected a JSON object")
    try:
        value = json.loads(
            body.decode("utf-8"),  # strictly: json.loads(bytes) would take UTF-16 and UTF-32 too
            object_pairs_hook=_no_duplicates,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError:
        raise InputError("request body: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"request body: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InputError("request body: JSON nested too deeply") from None
    _check_text(value, ())
    return value


def parse_input(value, where: str, limits: Limits, *, needs_choices: bool) -> Input:
    """One input mapping -> Input, or one InputError naming `where` and the field."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected an object with a question, got {_type(value)}")
    unknown = sorted(set(value) - set(_INPUT_KEYS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}: unknown field (allowed: {', '.join(_INPUT_KEYS)})")
    if "question" not in value:
        raise InputError(f"{where}.question: missing (the text to answer)")
    question = value["question"]
    if not isinstance(question, str):
        raise InputError(f"{where}.question: expected a string, got {_type(question)}")
    if not question.strip():
        raise InputError(f"{where}.question: expected a non-empty string")
    _unicode(question, f"{where}.question")
    if len(question) > limits.max_chars:
        raise InputError(
            f"{where}.question: {len(question):,} characters, over this server's limit of {limits.max_chars:,}", 413
        )
    choices = value.get("choices")
    if choices is None:
        if needs_choices:
            raise InputError(f"{where}.choices: missing (this task's items each have their own choices)")
        return Input(question)
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InputError(f"{where}.choices: expected an array of strings, got {_type(choices)}")
    if len(choices) < 2:
        raise InputError(f"{where}.choices: expected at least 2 choices, got {len(choices)}")
    if len(choices) > limits.max_choices:
        raise InputError(
            f"{where}.choices: {len(choices)} choices, over this server's limit of {limits.max_choices}", 413
        )
    for k, choice in enumerate(choices):
        if not choice.strip():
            raise InputError(f"{where}.choices[{k}]: expected a non-empty string")
        _unicode(choice, f"{where}.choices[{k}]")
        if len(choice) > limits.max_choice_chars:
            raise InputError(
                f"{where}.choices[{k}]: {len(choice):,} characters, over this server's limit of "
                f"{limits.max_choice_chars:,}",
                413,
            )
    return Input(question, tuple(choices))


def parse_request(body, limits: Limits, *, needs_choices: bool) -> tuple[list[Input], bool]:
    """A request body (parsed JSON) -> (its inputs, whether it was a batch). One input is
    `{"question": ..., "choices": [...]}`; a batch is `{"inputs": [one input, ...]}`."""
    if not isinstance(body, dict):
        raise InputError(f"request body: expected a JSON object, got {_type(body)}")
    if "inputs" in body:
        extra = sorted(set(body) - {"inputs"})
        if extra:
            raise InputError(f'{extra[0]}: unknown field beside inputs (a batch is {{"inputs": [...]}})')
        batch = body["inputs"]
        if not isinstance(batch, list):
            raise InputError(f"inputs: expected an array of inputs, got {_type(batch)}")
        if not batch:
            raise InputError("inputs: expected at least one input")
        if len(batch) > limits.max_inputs:
            raise InputError(f"inputs: {len(batch)} inputs, over this server's limit of {limits.max_inputs}", 413)
        return [parse_input(v, f"inputs[{i}]", limits, needs_choices=needs_choices) for i, v in enumerate(batch)], True
    return [parse_input(body, "request", limits, needs_choices=needs_choices)], False


__all__ = ["MAX_NUMBER_CHARS", "Input", "InputError", "Limits", "parse_input", "parse_json_body", "parse_request"]
