"""Answer extractors and matchers: small composable functions, as in lm-eval's filters."""

from __future__ import annotations

import re
import string
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?\\?(?:boxed\{)?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)


def gsm8k_gold(solution: str) -> str:
    """The number after '####' in a GSM8K reference solution."""
    if "####" not in solution:
        raise ValueError("GSM8K solution without '#### N'")
    return normalize_number(solution.rsplit("####", 1)[1])


def final_number(text: str) -> tuple[str | None, int]:
    """The model's final numeric answer and where it starts in `text` (-1 if none).

    Priority: '#### N', then 'the answer is N', then the last number in the text (lm-eval's flexible extract).
    """
    if "####" in text:
        tail_start = text.rindex("####") + 4
        match = _NUMBER.search(text, tail_start)
        if match:
            return normalize_number(match.group()), match.start()
    matches = list(_ANSWER_IS.finditer(text))
    if matches:
        m = matches[-1]
        return normalize_number(m.group(1)), m.start(1)
    matches = list(_NUMBER.finditer(text))
    if matches:
        m = matches[-1]
        return normalize_number(m.group()), m.start()
    return None, -1


_ANSWER_LINE = re.compile(r"^[ \t*#]*(?:final\s+)?answer\s*\**\s*:[ \t*]*(.*?)[ \t*]*$", re.IGNORECASE | re.MULTILINE)


def answer_line(text: str) -> tuple[str, int] | None:
    """The content of the first explicit 'Answer: ...' line and where it starts in `text` (None if no such
    line): the Taboo paper's extraction reads the model's first stated answer, so a hallucinated follow-up
    question with its own answer never counts."""
    match = _ANSWER_LINE.search(text)
    if match is None or not match.group(1):
        return None
    return match.group(1), match.start(1)


def first_number(text: str) -> tuple[str | None, int]:
    """The first number in `text` and where it starts (-1 if none): what an explicit answer line states."""
    match = _NUMBER.search(text)
    return (normalize_number(match.group()), match.start()) if match else (None, -1)


def normalize_number(text: str) -> str:
    """'$1,234.50' -> '1234.5'; anything unparsable is returned stripped."""
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return cleaned
    normalized = format(value.normalize(), "f")
    return "0" if normalized in ("-0", "") else normalized


def numbers_equal(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Decimal(normalize_number(a)) == Decimal(normalize_number(b))
    except InvalidOperation:
        return normalize_number(a) == normalize_number(b)


def squad_normalize(text: str) -> str:
    """SQuAD answer normalization: lower case, drop punctuation and articles, squeeze whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def first_line(text: str) -> tuple[str, int]:
    """The first non-empty line of a short generative answer and where it starts."""
    stripped = text.lstrip()
    start = len(text) - len(stripped)
    return stripped.split("\n", 1)[0].strip(), start


def alias_match(prediction: str, aliases: tuple[str, ...]) -> bool:
    pred = squad_normalize(prediction)
    return bool(pred) and pred in {squad_normalize(a) for a in aliases}


_LETTER_ANSWER_IS = re.compile(r"answer is[:\s]*\(?([A-Z])\b", re.IGNORECASE)
_LEADING_LETTER = re.compile(r"^\s*\(?([A-Z])(?:[).:\s]|$)")
_ANY_LETTER = re.compile(r"\b([A-Z])\b")


def choice_answer(text: str, choice_texts: list[str]) -> tuple[int | None, int]:
    """The choice a generated answer names, and where it starts in `text` (-1 if none).

    Priority: 'the answer is X', a leading letter ('B', '(B)', 'B.'), the text of one option (SQuAD-normalized,
    at the start of the first line), then the first standalone option letter of the first line. Letters
    beyond the number of choices never count.
    """
    letters = [chr(ord("A") + i) for i in range(len(choice_texts))]
    match = _LETTER_ANSWER_IS.search(text)
    if match and match.group(1).upper() in letters:
        return letters.index(match.group(1).upper()), match.start(1)
    match = _LEADING_LETTER.match(text)
    if match and match.group(1) in letters:
        return letters.index(match.group(1)), match.start(1)
    line, start = first_line(text)
    normalized = squad_normalize(line)
    by_length = sorted(range(len(choice_texts)), key=lambda i: -len(choice_texts[i]))
    for i in by_length:  # the longest option that the answer starts with (so "New York City" beats "New York")
        option = squad_normalize(choice_texts[i])
        if option and (normalized == option or normalized.startswith(option + " ")):
            return i, start
    for match in _ANY_LETTER.finditer(line):
        if match.group(1) in letters:
            return letters.index(match.group(1)), start + match.start(1)
    return None, -1
