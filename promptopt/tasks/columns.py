"""Derived columns: lm-eval's `process_docs` without code.

```yaml
columns:                       # computed once per row, in this order; each may use the ones before it
  texts: "([activity_label ~ ': ' ~ ctx_a ~ ' ' ~ ctx_b|capitalize] + endings)
          | map('trim') | map('replace', ' [title]', '. ') | map('regex_replace', '\\\\[.*?\\\\]', '')
          | map('replace', '  ', ' ') | list"
  query: "texts[0]"
  endings_clean: "texts[1:]"
doc_to_text: query             # every doc_to_* field (and fields:) reads them like the row's own columns
doc_to_choice: endings_clean
```

A value is a Jinja **expression** over the row (`ctx_a ~ ' ' ~ ctx_b`, `endings | map('trim') | list`), evaluated
in the task sandbox (tasks/jinja.py: `regex_replace`, `strip`, `capitalize`, ...) and kept as the value it is (a
list stays a list); `"{{ expression }}"` means the same. A string with text around its `{{ }}` is a template and
gives text. A name the row does not have is an error naming the column, the file and the row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from promptopt.errors import ConfigError
from promptopt.tasks.fields import RowRef, did_you_mean, shown_columns, template_limit
from promptopt.tasks.jinja import TemplateLimit, TemplateTimeout, evaluate, jinja_env, render, template_names
from promptopt.yamlio import shown

_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{(.*)\}\}\s*$", re.S)
_JINJA_MARK = re.compile(r"\{\{|\{%")
_NAME = re.compile(r"^[A-Za-z_]\w*$")


@dataclass(frozen=True)
class DerivedColumn:
    name: str
    source: str  # as written
    compiled: Any  # an expression (returns a value) or a template (returns text)
    is_template: bool
    names: tuple[str, ...]  # what it reads from the row


def parse_columns(raw: Any, where: str) -> tuple[DerivedColumn, ...]:
    import jinja2

    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(
            f"{where}: columns: expected a mapping of column name to a Jinja expression, got {shown(raw)}"
        )
    env, out = jinja_env(), []
    for name, source in raw.items():
        key = f"columns.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(f"{where}: columns: column name {shown(name)}: expected letters, digits and '_'")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}: {key}: expected a Jinja expression (text), got {shown(source)}")
        whole = _WHOLE_EXPRESSION.match(source)
        expression = whole.group(1) if whole and "{{" not in whole.group(1) else None
        if expression is None and not _JINJA_MARK.search(source):
            expression = source
        try:
            if expression is not None:
                compiled = env.compile_expression(expression, undefined_to_none=False)
                names = template_names("{{ " + expression + " }}")
            else:
                compiled, names = env.from_string(source), template_names(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{where}: {key}: invalid Jinja expression ({exc.message})") from None
        out.append(DerivedColumn(name, source, compiled, expression is None, names))
    return tuple(out)


def apply_columns(columns: tuple[DerivedColumn, ...], row: dict, ref: RowRef) -> dict:
    """The row with every derived column added (later columns see earlier ones)."""
    if not columns:
        return row
    import jinja2

    row = dict(row)
    for column in columns:
        key = f"columns.{column.name}"
        try:
            value = render(column.compiled, row) if column.is_template else evaluate(column.compiled, row)
        except TemplateLimit as exc:
            if isinstance(exc, TemplateTimeout):  # one regex on one row's value: that row's
                raise ref.fail(key, f"expression failed: {type(exc).__name__}: {exc}") from None
            raise template_limit(ref, key, exc) from None
        except jinja2.UndefinedError as exc:
            raise _undefined(column, row, ref, key, exc.message) from None
        except Exception as exc:  # an expression over the row's values failed (an index, a filter, a regex)
            raise ref.fail(key, f"expression failed: {type(exc).__name__}: {exc}") from None
        if isinstance(value, jinja2.Undefined):
            raise _undefined(column, row, ref, key, None)
        row[column.name] = value
    return row


def _undefined(column: DerivedColumn, row: dict, ref: RowRef, key: str, message: str | None):
    absent = [n for n in column.names if n not in row]
    columns = shown_columns(row)
    if absent:
        return ref.fail(
            key,
            f"the expression reads '{absent[0]}', which is not a column (columns: {columns}){did_you_mean(absent[0], row)}",
        )
    if message is None:  # the expression's value itself is undefined: an index or key the row's values lack
        return ref.fail(
            key,
            f"the expression gives an undefined value (an index or key the row's values do not have; columns: {columns})",
        )
    return ref.fail(key, f"the expression reads a value the row does not have: {message} (columns: {columns})")
