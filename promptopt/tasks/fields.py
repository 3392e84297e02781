"""How a task reads a data row: lm-evaluation-harness's `doc_to_text` / `doc_to_choice` / `doc_to_target`.

A field spec is one of
- a **column name**: the column's value (a dotted path reaches into nested rows: `doc.question`,
  `choices.text`, `answers.0`);
- a **Jinja template** (`{{ ... }}` or `{% ... %}`) over the row, as in lm-eval: rendered in a sandbox,
  and a name the row does not have is an error, never an empty string. For `doc_to_choice` the rendered
  text is a Python literal list (lm-eval's PIQA: `"{{[sol1, sol2]}}"`); for `doc_to_target` rendered digits
  are an index;
- a **`{column}` format string** (the short form): `"sst2-{idx}"`, `"{passage}\nQuestion: {question}?"`;
- a **list** (choices): each entry a column name, a template, or a literal word (`[negative, positive]`).

A name that is a column is never taken as a literal; a literal entry beside column entries, or one that
is one typo away from a column, is an error. Templates are compiled when the task YAML is read, so a
syntax error names the file and key before any data is loaded.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from promptopt.errors import ConfigError, DataError
from promptopt.tasks.jinja import jinja_env
from promptopt.yamlio import shown

_FORMAT_FIELD = re.compile(r"\{([^{}]+)\}")
_JINJA_MARK = re.compile(r"\{\{|\{%")
_IDENTIFIER = re.compile(r"^[A-Za-z_][\w.-]*$")


class RowError(DataError):
    """A field cannot be read from a row; `key` and `message` without the row, so a loader can tell a
    mistake every row shares (then it names the first row and says so) from one row's. `shared`: the mistake
    without this row's values, when the message quotes them (`'sol1' holds text ('...')`): rows whose
    messages differ only in their own values share that mistake (default: the message itself)."""

    def __init__(self, ref: RowRef, key: str, message: str, shared: str | None = None) -> None:
        super().__init__(f"{ref.where}: {key}: {message}")
        self.ref, self.key, self.message = ref, key, message
        self.shared = message if shared is None else shared


@dataclass(frozen=True)
class RowRef:
    """Where a row came from, for error messages: `data/piqa.jsonl line 6`, `validation row 12`; `source` is
    the file or dataset itself."""

    id: str
    where: str
    source: str = ""

    def fail(self, key: str, message: str, shared: str | None = None) -> RowError:
        return RowError(self, key, message, shared)


def lookup(row: Any, path: str) -> tuple[bool, Any]:
    """(found, value) for a column name or dotted path."""
    value = row
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


SHOWN_COLUMNS, SHOWN_COLUMN_CHARS = 8, 24  # a data file's header as an error quotes it (it may be any file's line)


def _column_name(name: Any) -> str:
    text = str(name)
    return text if len(text) <= SHOWN_COLUMN_CHARS else text[: SHOWN_COLUMN_CHARS - 1] + "…"


def shown_columns(row: Any) -> str:
    """A row's column names, bounded: the first SHOWN_COLUMNS, each cut to SHOWN_COLUMN_CHARS characters."""
    if not isinstance(row, dict):
        return "-"
    names = [_column_name(c) for c in list(row)[:SHOWN_COLUMNS]]
    more = len(row) - len(names)
    return ", ".join(names) + (f", … ({more} more)" if more > 0 else "")


def did_you_mean(name: str, row: Any) -> str:
    """`; did you mean 'x'?` when a column of the row is a likely typo of `name` (its first part), else ''."""
    top = name.split(".")[0]
    if not isinstance(row, dict) or top in row:
        return ""
    close = difflib.get_close_matches(top, [str(c) for c in row], n=1, cutoff=0.7)
    return f"; did you mean '{name.replace(top, _column_name(close[0]), 1)}'?" if close else ""


def missing_column(name: str, row: Any) -> str:
    return f"column '{name}' not found (columns: {shown_columns(row)}){did_you_mean(name, row)}"


@dataclass(frozen=True)
class FieldSpec:
    """One compiled field: `resolve(row, ref)` gives its value for a row."""

    key: str  # the YAML key, for messages (`doc_to_choice`, `fields.question`)
    raw: Any
    kind: str  # column | jinja | format | list | literal | function (the task's own Python, see task_code.py)
    template: Any = None
    entries: tuple[FieldSpec, ...] = ()
    names: tuple[str, ...] = ()  # the names a Jinja template reads from the row

    @classmethod
    def parse(cls, raw: Any, key: str, where: str) -> FieldSpec:
        from promptopt.tasks.task_code import TaskFunction

        if isinstance(raw, TaskFunction):
            return cls(key, raw, "function", template=raw)
        if isinstance(raw, bool) or raw is None:
            raise ConfigError(f"{where}: {key}: expected a column name, a template or a list, got {shown(raw)}")
        if isinstance(raw, int):
            return cls(key, raw, "literal")
        if isinstance(raw, list):
            if not raw:
                raise ConfigError(f"{where}: {key}: expected a non-empty list")
            entries = []
            for i, entry in enumerate(raw):
                if not isinstance(entry, (str, int)) or isinstance(entry, bool):
                    raise ConfigError(
                        f"{where}: {key}[{i}]: expected a column name, a template or a word, got {shown(entry)}"
                    )
                entries.append(cls.parse(str(entry), f"{key}[{i}]", where))
            return cls(key, raw, "list", entries=tuple(entries))
        if not isinstance(raw, str):
            raise ConfigError(f"{where}: {key}: expected a column name, a template or a list, got {type(raw).__name__}")
        if _JINJA_MARK.search(raw):
            import jinja2

            from promptopt.tasks.jinja import template_names

            try:
                template = jinja_env().from_string(raw)
                names = template_names(raw)
            except jinja2.TemplateSyntaxError as exc:
                raise ConfigError(
                    f"{where}: {key}: invalid Jinja template (line {exc.lineno}: {exc.message})"
                ) from None
            return cls(key, raw, "jinja", template=template, names=names)
        if _FORMAT_FIELD.search(raw):
            return cls(key, raw, "format")
        return cls(key, raw, "column")

    # --- per row ----------------------------------------------------------------------------------
    def resolve(self, row: dict, ref: RowRef) -> Any:
        if self.kind == "literal":
            return self.raw
        if self.kind == "function":
            return self.template.call(row, ref, self.key)
        if self.kind == "column":
            found, value = lookup(row, self.raw)
            if not found:
                raise ref.fail(self.key, missing_column(self.raw, row))
            return value
        if self.kind == "format":

            def field(match: re.Match) -> str:
                found, value = lookup(row, match.group(1))
                if not found:
                    raise ref.fail(self.key, missing_column(match.group(1), row))
                return str(value)

            return _FORMAT_FIELD.sub(field, self.raw)
        if self.kind == "jinja":
            return self.render(row, ref)
        return self._resolve_list(row, ref)

    def render(self, row: dict, ref: RowRef) -> str:
        """The compiled template over the row; a name the row lacks, or a failing expression, names the field."""
        import jinja2

        from promptopt.tasks.jinja import TemplateLimit, TemplateTimeout, render

        try:
            return render(self.template, row)
        except TemplateLimit as exc:
            if isinstance(exc, TemplateTimeout):  # one regex on one row's value: that row's
                raise ref.fail(self.key, f"template failed: {type(exc).__name__}: {exc}") from None
            raise template_limit(ref, self.key, exc) from None
        except jinja2.UndefinedError as exc:
            absent = [n for n in self.names if not isinstance(row, dict) or n not in row]
            if absent:  # name the column (Jinja's own message may name a value, or 'dict object')
                raise ref.fail(
                    self.key,
                    f"the template reads '{absent[0]}', which is not a column "
                    f"(columns: {shown_columns(row)}){did_you_mean(absent[0], row)}",
                ) from None
            raise ref.fail(
                self.key,
                f"the template reads a value the row does not have: {exc.message} (columns: {shown_columns(row)})",
            ) from None
        except jinja2.TemplateError as exc:
            raise ref.fail(self.key, f"template failed: {exc}") from None
        except Exception as exc:  # an expression over the row (indexing, a filter) failed on its values
            raise ref.fail(self.key, f"template failed: {type(exc).__name__}: {exc}") from None

    def _resolve_list(self, row: dict, ref: RowRef) -> list:
        is_column = [e.kind == "column" and lookup(row, e.raw)[0] for e in self.entries]
        if any(is_column) and not all(is_column):
            bad = next(e for e, col in zip(self.entries, is_column) if not col)
            raise ref.fail(
                bad.key,
                f"'{bad.raw}' is not a column but the other entries are (columns: {shown_columns(row)})"
                f"{did_you_mean(bad.raw, row)}",
            )
        values = []
        for entry, column in zip(self.entries, is_column):
            if column or entry.kind != "column":
                values.append(entry.resolve(row, ref))
                continue
            # a bare word that is not a column: a literal choice, unless it is one typo away from a column
            if isinstance(row, dict):
                close = difflib.get_close_matches(entry.raw, [str(c) for c in row], n=1, cutoff=0.8)
                if close and _IDENTIFIER.match(entry.raw):
                    raise ref.fail(
                        entry.key,
                        f"'{entry.raw}' is not a column; did you mean '{_column_name(close[0])}'? "
                        f"(write a literal word that looks like a column as \"{{{{ '{entry.raw}' }}}}\")",
                    )
            values.append(entry.raw)
        return values

    # --- typed views ------------------------------------------------------------------------------
    def text(self, row: dict, ref: RowRef) -> str:
        return self._text(self.resolve(row, ref), ref)

    def text_or_index(self, row: dict, ref: RowRef) -> str | int:
        """lm-eval's `doc_to_text` of a multiple-choice task: the text, or an answer index where the choices are
        alternative contexts (lm-eval's multiple inputs, Winogrande): an integer from a column or a function, or a
        template that renders digits (lm-eval reads those as an index whenever the task has choices)."""
        value = self.resolve(row, ref)
        if isinstance(value, Integral) and not isinstance(value, bool):
            return int(value)
        if self.kind == "jinja" and isinstance(value, str) and value.isdigit():
            return int(value)
        return self._text(value, ref)

    def _text(self, value: Any, ref: RowRef) -> str:
        if isinstance(value, (list, tuple, dict)):
            raise ref.fail(self.key, f"expected text, got a {type(value).__name__} ({_short(value)})", "expected text")
        if value is None:
            raise ref.fail(self.key, "is empty (null)")
        return str(value)

    def choices(self, row: dict, ref: RowRef) -> list[str]:
        """A list of at least two choice texts; anything else is an error naming the row."""
        value = self.resolve(row, ref)
        if self.kind == "jinja" and isinstance(value, str):
            try:
                value = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                raise ref.fail(
                    self.key, f"template must render a list such as ['a', 'b'], got {_short(value)}", "not a list"
                ) from None
        if isinstance(value, str):
            raise ref.fail(
                self.key,
                f"'{self.raw}' holds text ({_short(value)}), not a list of choices; name several columns as a list, "
                f"e.g. [{self.raw}, other_column]",
                "holds text",
            )
        if isinstance(value, dict):
            value = list(value.values())
        if not isinstance(value, (list, tuple)) or len(value) < 2:
            raise ref.fail(self.key, f"expected a list of at least two choices, got {_short(value)}", "too few")
        if any(isinstance(v, (list, tuple, dict)) or v is None for v in value):
            raise ref.fail(self.key, f"every choice must be text, got {_short(value)}", "not text")
        return [str(v) for v in value]

    def target(self, row: dict, ref: RowRef) -> Any:
        """A target as lm-eval reads it: a rendered template of digits is an index."""
        value = self.resolve(row, ref)
        if self.kind == "jinja" and isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        return value


def template_limit(ref: RowRef, key: str, exc: Exception) -> ConfigError:
    """A template past promptopt's limits fails at once (not row by row: a template that ran a second on one row
    would on the next), in one line naming the row, the key and the limit."""
    return ConfigError(f"{ref.where}: {key}: the template {exc} (tasks/jinja.py; see docs/tasks.md)")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
