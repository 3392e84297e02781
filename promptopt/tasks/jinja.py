"""The sandboxed Jinja environment every task template and derived column is rendered in.

One immutable sandbox (no attribute that reaches Python internals, no method that changes a value) with strict
undefined names, as lm-evaluation-harness renders its `doc_to_*` templates, plus the string helpers lm-eval's
preprocessors need, so that they can be written without code:

- `regex_replace(pattern, repl, count=0)`: lm-eval's own filter (`re.sub`), with a time limit per call: a pattern
  that backtracks catastrophically on some row fails that row in one line instead of hanging the run;
- `strip(chars=None)`: Python's `str.strip` (Jinja's `trim` strips whitespace only in older versions);
- `capitalize` and `trim`, `replace`, `lower`, `map`, `list`, ... are Jinja's own; `text.strip()`,
  `text.capitalize()` and other non-mutating `str` methods can be called as in Python.
"""

from __future__ import annotations

from typing import Any

REGEX_SECONDS = 1.0  # per regex_replace call
_ENV = None


class TemplateTimeout(ValueError):
    """A `regex_replace` pattern ran past its time limit on a value."""


def regex_replace(value: Any, pattern: str, repl: str, count: int = 0) -> str:
    """`re.sub(pattern, repl, value, count=count)`, as lm-eval's filter of the same name, under a time limit.

    The `regex` package (a dependency of transformers) in its `re`-compatible mode gives `re.sub`'s results and
    takes a timeout; where it is missing, `re` runs without one."""
    try:
        import regex
    except ImportError:  # pragma: no cover - transformers requires it
        import re

        return re.sub(pattern, repl, str(value), count=count)
    try:
        return regex.sub(pattern, repl, str(value), count=count, flags=regex.VERSION0, timeout=REGEX_SECONDS)
    except TimeoutError:
        raise TemplateTimeout(f"regex_replace({pattern!r}) ran past {REGEX_SECONDS:g} s on a value") from None


def _strip(value: Any, chars: str | None = None) -> str:
    return str(value).strip(chars)


def jinja_env():
    """One sandboxed, immutable environment with strict undefined names (lm-eval's choice); an undefined
    value fails even inside a rendered list (`{{[a, b]}}` calls repr, which plain StrictUndefined allows)."""
    global _ENV
    if _ENV is None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Strict(jinja2.StrictUndefined):
            __slots__ = ()
            __repr__ = jinja2.StrictUndefined._fail_with_undefined_error

        env = ImmutableSandboxedEnvironment(undefined=Strict, keep_trailing_newline=True)
        env.filters["regex_replace"] = regex_replace
        env.filters["strip"] = _strip
        _ENV = env
    return _ENV


def template_names(source: str) -> tuple[str, ...]:
    """The names a template (or expression wrapped as `{{ ... }}`) reads from the row."""
    from jinja2 import meta

    env = jinja_env()
    return tuple(sorted(meta.find_undeclared_variables(env.parse(source)) - set(env.globals)))
