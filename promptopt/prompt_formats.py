"""Equivalent formats of one prompt template: the same fields, laid out differently.

FormatSpread (Sclar et al., arXiv 2310.11324) measured accuracy spreads of up to 76 points on LLaMA-2-13B from
formatting alone, so format is both a perturbation family (`format`, robustness/perturb.py) and a searchable
dimension (a space's `formats:` block). A format changes, in the template's own text only:
- the separator between a field name and its value (`Review: …` -> `Review - …`, `Review:\\n…`, `Review …`),
- the casing of the field names (`Review` -> `review`, `REVIEW`),
- what joins the template's lines (`\\n` -> `\\n\\n`, ` \\n`),
- the delimiter between the instruction, the exemplars and the query (the template's `separator`).
The item's text, the exemplars' answers and the label words are never touched: only the layout around them.

A field is a template line that starts with a name and a colon (`Sentiment:`, `Question: {question}`). A
query that ends in a field with no value (`…\\nSentiment:`) is answered after `answer_delimiter`; its separator
is split between the two, so `Sentiment - positive` and `Sentiment:\\npositive` read as the other fields do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from promptopt.errors import ConfigError
from promptopt.prompts import PromptTemplate

FIELD_SEPARATORS = (": ", ":\n", " - ", " ")
CASINGS = ("as_is", "lower", "upper", "title")
LINE_JOINERS = ("\n", "\n\n", " \n")
EXEMPLAR_DELIMITERS = ("\n\n", "\n", "\n\n\n", "\n---\n")
DIMENSIONS = {
    "field_separator": FIELD_SEPARATORS,
    "casing": CASINGS,
    "line_joiner": LINE_JOINERS,
    "exemplar_delimiter": EXEMPLAR_DELIMITERS,
}

_FIELD = re.compile(r"^(?P<name>[A-Za-z][A-Za-z ]{0,29}?):(?P<rest>(?: (?P<value>.*))?)$")


@dataclass(frozen=True)
class PromptFormat:
    """One choice per dimension; None keeps the template's own (so `PromptFormat()` changes nothing)."""

    field_separator: str | None = None
    casing: str | None = None
    line_joiner: str | None = None
    exemplar_delimiter: str | None = None

    def __post_init__(self) -> None:
        for name, allowed in DIMENSIONS.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ConfigError(f"format {name}: expected one of {list(allowed)}, got {value!r}")

    def apply(self, template: PromptTemplate) -> PromptTemplate:
        """The template in this format; label words, choice format and chat flag are kept."""
        changes = {}
        if template.exemplar is not None:
            changes["exemplar"] = self._lines(template.exemplar, final=False)[0]
        query, delimiter = self._lines(template.query, final=True, delimiter=template.answer_delimiter)
        changes.update(query=query, answer_delimiter=delimiter)
        if self.exemplar_delimiter is not None:
            changes["separator"] = self.exemplar_delimiter
        return replace(template, **changes)

    def _name(self, name: str) -> str:
        return {None: name, "as_is": name, "lower": name.lower(), "upper": name.upper(), "title": name.title()}[
            self.casing
        ]

    def _lines(self, text: str, *, final: bool, delimiter: str = " ") -> tuple[str, str]:
        lines = text.split("\n")
        out = []
        for position, line in enumerate(lines):
            match = _FIELD.match(line)
            if match is None or (match.group("rest") == "" and not (final and position == len(lines) - 1)):
                out.append(line)
                continue
            name, value = self._name(match.group("name")), match.group("value")
            separator = self.field_separator or ": "
            if value is not None:
                out.append(name + separator + value)
            elif delimiter in (" ", "\n"):  # the query's last field: its value is the answer, after the delimiter
                head = separator.rstrip(" \n")
                tail = separator[len(head) :] or " "
                out.append(name + head)
                delimiter = tail if self.field_separator else delimiter
            else:  # an unusual delimiter is the template's own choice: only the name changes
                out.append(name + ":")
        joined = (self.line_joiner or "\n").join(out)
        return joined, delimiter


def format_choices(options: dict | None, where: str) -> dict[str, tuple[str, ...]]:
    """A space's `formats:` block -> the choices per dimension (`true` for a dimension: all of its choices)."""
    if not options:
        return {}
    if not isinstance(options, dict):
        raise ConfigError(f"{where}: formats: expected a mapping of dimension -> list of choices, got {options!r}")
    out = {}
    for name, values in options.items():
        if name not in DIMENSIONS:
            raise ConfigError(f"{where}: formats.{name}: unknown format dimension (use {', '.join(DIMENSIONS)})")
        if values is True:
            values = list(DIMENSIONS[name])
        if not isinstance(values, list) or not values or any(v not in DIMENSIONS[name] for v in values):
            raise ConfigError(
                f"{where}: formats.{name}: expected true or a list drawn from {list(DIMENSIONS[name])}, got {values!r}"
            )
        out[name] = tuple(values)
    return out
