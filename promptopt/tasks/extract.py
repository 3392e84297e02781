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


_ANSWER_LINE = re.compile(
    r"^[ \t*#]*(?:final[ \t]+)?answer[ \t]*\**[ \t]*:[ \t*]*(.*?)[ \t*]*$", re.IGNORECASE | re.MULTILINE
)


def answer_lines(text: str):
    """Each explicit 'Answer: ...' line, in order, as (content, where it starts in `text`); an empty one
    ('Answer:' then a line break) states what the next non-empty line says. The Taboo paper's extraction
    reads the model's first stated answer, so a hallucinated follow-up question's answer never counts."""
    for match in _ANSWER_LINE.finditer(text):
        if match.group(1):
            yield match.group(1), match.start(1)
            continue
        rest = text[match.end() :]
        stripped = rest.lstrip()
        if stripped:
            line = stripped.split("\n", 1)[0].strip()
            yield line, match.end() + len(rest) - len(stripped)


def answer_line(text: str) -> tuple[str, int] | None:
    """The first explicit answer line (see `answer_lines`), or None."""
    return next(answer_lines(text), None)


def stated_number(line: str) -> tuple[str | None, int]:
    """The number an answer line states and where it starts (-1 if none): the first number after the last
    '=' ('Answer: 5 - 3 = 2' states 2), else the first number ('Answer: 25 dollars in 3 days' states 25)."""
    start = line.rindex("=") + 1 if "=" in line else 0
    match = _NUMBER.search(line, start)
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


def answer_is_letter(text: str, n_choices: int) -> tuple[int | None, int]:
    """The option letter in 'the answer is (X)' and where it starts (None, -1 if absent or out of range)."""
    match = _LETTER_ANSWER_IS.search(text)
    if match and ord(match.group(1).upper()) - ord("A") < n_choices:
        return ord(match.group(1).upper()) - ord("A"), match.start(1)
    return None, -1


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
