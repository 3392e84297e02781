"""Which proposed instructions enter the space, and why the others do not (every drop counted by reason,
as the perturbation filter counts its drops).

Reasons, checked in this order (the cheap text checks first, the embedding last):
- `empty`: nothing left after cleaning;
- `too_short` / `too_long`: fewer than 3 or more than 80 words;
- `markup`: template braces or chat markers (they would break rendering or impersonate a turn);
- `leaks_gold`: the gold answer of a dev or test item, as a whole word (an instruction that names an
  evaluation item's answer scores on leakage). Answers every item shares (label words such as SST-2's
  negative/positive) are a task's vocabulary, not leakage, and one-character answers are too common to test;
- `only_label_words`: nothing but label words (and joiners such as "or");
- `quotes_item`: 6 consecutive words of a dev or test item's question (reflect shows dev texts, and a small
  proposer copies them: an instruction that quotes evaluation items is about those items, not the task);
- `near_duplicate`: all-MiniLM cosine ≥ 0.9 with an instruction already in the space or accepted before.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from promptopt.tasks.item import Item

MIN_WORDS, MAX_WORDS = 3, 80
QUOTE_WORDS = 6
DUPLICATE_COSINE = 0.9
MARKERS = (
    "{",
    "}",
    "<|",
    "|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "<<SYS>>",
    "<s>",
    "</s>",
    "<bos>",
    "<eos>",
)
_JOINERS = {"or", "and", "a", "an", "the", "is", "it", "either", "one", "of"}
_WORD = re.compile(r"[\w']+")


def one_line(text: str, width: int) -> str:
    """A proposal's (or an instruction's) text as messages show it: whitespace collapsed, at most `width`
    characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def gold_strings(items: list[Item]) -> set[str]:
    """Every answer string an item counts as correct (lowercased)."""
    out: set[str] = set()
    for item in items:
        if item.choices is not None and isinstance(item.gold, int) and 0 <= item.gold < len(item.choices):
            out.add(item.choices[item.gold])
        elif isinstance(item.gold, (tuple, list)):
            out.update(str(g) for g in item.gold)
        elif (
            isinstance(item.gold, str) and item.meta.get("entry_point") is None
        ):  # code tasks: the gold is a test program
            out.add(item.gold)
    return {" ".join(s.lower().split()) for s in out if s and s.strip()}


def label_words(items: list[Item], template_words=()) -> set[str]:
    """Choices every item shares (a fixed label set) and the space's label words, lowercased."""
    sets = [set(i.choices) for i in items if i.choices is not None]
    shared = set.intersection(*sets) if sets and len(sets) == len(items) else set()
    return {" ".join(w.lower().split()) for w in (*shared, *template_words) if w and w.strip()}


def shingles(texts, k: int = QUOTE_WORDS) -> set[tuple[str, ...]]:
    """Every run of k consecutive words of the texts (lowercased)."""
    out = set()
    for text in texts:
        words = _WORD.findall(str(text).lower())
        out.update(tuple(words[i : i + k]) for i in range(len(words) - k + 1))
    return out


@dataclass
class ProposalFilter:
    existing: list[str]  # instructions already in the space
    golds: set[str]  # gold answers of dev and test items
    labels: set[str]  # label words (not leakage)
    similarity: object  # (texts, texts) -> cosines (robustness.suite.Similarity)
    quoted: set = field(default_factory=set)  # shingles of the dev and test questions
    drops: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.kept = [t for t in self.existing if t.strip()]
        self._label_tokens = {t for label in self.labels for t in _WORD.findall(label)}
        testable = {g for g in self.golds - self.labels if len(g) > 1}
        self._leak = (
            re.compile(
                r"(?<![\w])(?:" + "|".join(re.escape(g) for g in sorted(testable, key=len, reverse=True)) + r")(?![\w])"
            )
            if testable
            else None
        )

    def reason(self, text: str) -> str | None:
        """Why `text` is rejected, or None when it may enter the space."""
        if not text.strip():
            return "empty"
        words = _WORD.findall(text.lower())
        if len(words) < MIN_WORDS:
            return "too_short"
        if len(words) > MAX_WORDS:
            return "too_long"
        if any(marker in text for marker in MARKERS):
            return "markup"
        if self._leak is not None and self._leak.search(" ".join(text.lower().split())):
            return "leaks_gold"
        if self.quoted and shingles([text]) & self.quoted:
            return "quotes_item"
        if self._label_tokens and all(w in self._label_tokens or w in _JOINERS for w in words):
            return "only_label_words"
        if self.kept:
            cosines = self.similarity([text] * len(self.kept), self.kept)
            if float(max(cosines)) >= DUPLICATE_COSINE:
                return "near_duplicate"
        return None

    def admit(self, text: str) -> str | None:
        """Check `text`; count a drop by its reason, or keep it (later proposals are compared with it)."""
        why = self.reason(text)
        if why is None:
            self.kept.append(text)
        else:
            self.drops[why] += 1
        return why
