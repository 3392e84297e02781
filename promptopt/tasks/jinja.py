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

import re
import threading
import time
from contextlib import contextmanager
from typing import Any

REGEX_SECONDS = 1.0  # per regex_replace call
TEMPLATE_SECONDS = 1.0  # per rendered value (a field of one row, a derived column of one row)
TEMPLATE_SIZE = 1_000_000  # characters of a rendered value; characters + items of any value a template builds
TEMPLATE_INT_BITS = 4096  # the largest integer `*` or `**` may build (a 1,233-digit number)
_ENV = None
_STATE = threading.local()


class TemplateLimit(ValueError):
    """A template went past promptopt's limits on time or size (the message says which)."""


class TemplateTimeout(TemplateLimit):
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


# --- limits -------------------------------------------------------------------------------------------------------
@contextmanager
def bounded():
    """Render within TEMPLATE_SECONDS (checked at every loop step, call, operator and output chunk)."""
    outer = getattr(_STATE, "deadline", None)
    if outer is None:
        _STATE.deadline = time.monotonic() + TEMPLATE_SECONDS
    try:
        yield
    finally:
        if outer is None:
            _STATE.deadline = None


def _tick() -> None:
    deadline = getattr(_STATE, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimit(f"ran past {TEMPLATE_SECONDS:g} s, promptopt's limit for rendering one value")


def _too_big(what: str) -> TemplateLimit:
    return TemplateLimit(f"{what} would hold more than {TEMPLATE_SIZE:,} characters or items, promptopt's limit")


def size(value: Any, budget: int = TEMPLATE_SIZE) -> int:
    """Characters of strings and items of containers in `value` (a container held twice counts twice), counted up
    to just past `budget`: the work is bounded by the budget, not by the value."""
    total, stack = 0, [value]
    while stack and total <= budget:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += len(v)
            if total <= budget:
                stack.extend(v)
        elif isinstance(v, dict):
            total += len(v)
            if total <= budget:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, int) and not isinstance(v, bool):
            total += v.bit_length() // 64
    return total


def _check_size(value: Any, what: str) -> Any:
    if isinstance(value, (str, bytes, list, tuple, set, frozenset, dict)) and size(value) > TEMPLATE_SIZE:
        raise _too_big(what)
    return value


def _count(value: Any, what: str) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > TEMPLATE_SIZE:
        raise TemplateLimit(f"{what} {value if abs(value) < 10**30 else 'a huge number'}: more than {TEMPLATE_SIZE:,}")


_PRINTF = re.compile(r"%[-#0 +]*(\d+|\*)?(?:\.(\d+|\*))?")
_DIGITS = re.compile(r"\d+")


def _check_format(fmt: str, args: Any, what: str, braces: bool) -> None:
    """A format string's widths and precisions (printf's `%10s`, str.format's `{:10}`) and the numbers it may take
    from its arguments (`%*d`, `{:{w}}`) together within TEMPLATE_SIZE."""
    specs = (
        re.findall(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}", fmt) if braces else [m.group(0) for m in _PRINTF.finditer(fmt)]
    )
    widths = sum(int(d) for spec in specs for d in _DIGITS.findall(spec) if len(d) < 12) + sum(
        10**12 for spec in specs for d in _DIGITS.findall(spec) if len(d) >= 12
    )
    values = args.values() if isinstance(args, dict) else args if isinstance(args, (list, tuple)) else [args]
    widths += sum(abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 10**12)
    if widths > TEMPLATE_SIZE:
        raise _too_big(what)


def _replaced(text: str, old: str, new: str, count: int = -1) -> int:
    hits = len(text) + 1 if old == "" else text.count(old)
    hits = hits if count is None or count < 0 else min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _check_str_method(name: str, text: str, args: tuple, kwargs: dict) -> None:
    """What a `str` method call would build, estimated before it is built (the others never grow their text)."""
    what = f"{name}()"
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _count(args[0], what)
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int) and len(text) + text.count("\t") * max(tab, 0) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        if _replaced(text, args[0], args[1], count) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        if len(text) * max(len(args[0]) - 1, 0) + size(args[0]) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name in ("format", "format_map"):
        _check_format(text, [*args, *kwargs.values()], what, braces=True)
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        if len(text) * longest > TEMPLATE_SIZE:
            raise _too_big(what)


def _check_filter(name: str, args: tuple, kwargs: dict) -> None:
    """What a Jinja filter would build, estimated before it is built, for the filters whose output can outgrow
    their input (the others are bounded by it)."""
    what = f"the {name} filter"
    value = args[0] if args else None
    options = [*args[1:], *kwargs.values()]
    if name in ("center", "batch", "slice", "truncate", "tojson", "wordwrap"):
        for option in options:
            _count(option, what)
    if name == "tojson" and any(isinstance(o, int) and o > 16 for o in options):
        raise TemplateLimit(f"{what}: an indent over 16")
    if name == "indent" and isinstance(value, str):
        width = options[0] if options else kwargs.get("width", 4)
        pad = width if isinstance(width, int) else len(str(width))
        if len(value) + (value.count("\n") + 1) * max(pad, 0) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "wordwrap" and isinstance(value, str):
        wrap = next((o for o in options if isinstance(o, str)), "\n")
        if len(value) * (1 + len(wrap)) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "replace" and len(options) >= 2 and isinstance(options[0], str) and isinstance(options[1], str):
        count = options[2] if len(options) > 2 and isinstance(options[2], int) else -1
        if _replaced(str(value), options[0], options[1], count) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "join" and isinstance(value, (list, tuple)):
        sep = options[0] if options and isinstance(options[0], str) else ""
        if len(sep) * max(len(value) - 1, 0) + size(value) > TEMPLATE_SIZE:
            raise _too_big(what)
    elif name == "format" and isinstance(value, str):
        _check_format(value, options, what, braces=False)


def _bounded_filter(name: str, fn):
    import functools

    @functools.wraps(fn)  # keeps jinja's pass_context / pass_eval_context marks
    def bounded_filter(*args, **kwargs):
        _tick()
        plain = tuple(a for a in args if not _is_jinja_context(a))
        if name == "join" and plain and not isinstance(plain[0], (str, list, tuple, dict)):
            args = (*args[: len(args) - len(plain)], list(plain[0]), *plain[1:])  # a generator, counted once
            plain = tuple(a for a in args if not _is_jinja_context(a))
        _check_filter(name, plain, kwargs)
        return _check_size(fn(*args, **kwargs), f"the {name} filter's value")

    return bounded_filter


def _is_jinja_context(value: Any) -> bool:
    from jinja2 import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, (Context, EvalContext, Environment))


def _guard(iterable):
    """Every `{% for %}` loop iterates through this: one time check per step."""
    for item in iterable:
        _tick()
        yield item


def _bounded_join(parts) -> str:
    """Jinja's `environment.concat` (a template's output, a macro's, a `{% set %}` block's), within TEMPLATE_SIZE."""
    out, total = [], 0
    for part in parts:
        total += len(part)
        if total > TEMPLATE_SIZE:
            raise _too_big("the rendered text")
        out.append(part)
        _tick()
    return "".join(out)


def _environment_class():
    from jinja2 import nodes
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame) -> None:  # `a ~ b`: through the size check (Jinja joins it inline)
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with every loop, call, growing operator and output checked against promptopt's
        time and size limits (the module's TEMPLATE_* constants)."""

        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        concat = staticmethod(_bounded_join)

        def _parse(self, source, name, filename):
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(nodes.For):
                loop.iter = nodes.Filter(loop.iter, "_loop_guard", [], [], None, None, lineno=loop.lineno)
            return tree

        @staticmethod
        def bounded_concat(parts) -> str:
            _tick()
            texts = [str(p) for p in parts]
            if sum(map(len, texts)) > TEMPLATE_SIZE:
                raise _too_big("the joined text (~)")
            return "".join(texts)

        def call_binop(self, context, operator, left, right):
            _tick()
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                if right > 0 and right * left.bit_length() > TEMPLATE_INT_BITS:
                    raise TemplateLimit(
                        f"{left.bit_length()}-bit number ** {right}: a number over {TEMPLATE_INT_BITS:,} bits"
                    )
            elif operator == "*":
                if isinstance(left, int) and isinstance(right, int):
                    if left.bit_length() + right.bit_length() > TEMPLATE_INT_BITS:
                        raise TemplateLimit(f"a product of more than {TEMPLATE_INT_BITS:,} bits")
                else:
                    times, sequence = (left, right) if isinstance(left, int) else (right, left)
                    if isinstance(times, int) and isinstance(sequence, (str, list, tuple)):
                        if size(sequence) * max(times, 0) > TEMPLATE_SIZE:
                            raise _too_big(
                                f"{type(sequence).__name__} * {times if times < 10**30 else 'a huge number'}"
                            )
            elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                if size(left) + size(right) > TEMPLATE_SIZE:
                    raise _too_big("a sum (+)")
            elif operator == "%" and isinstance(left, str):
                _check_format(left, right, "a % format", braces=False)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            _tick()
            target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped by the sandbox
            owner = getattr(target, "__self__", None)
            if isinstance(owner, str):
                if getattr(target, "__name__", "") == "join" and args and not isinstance(args[0], (str, list, tuple)):
                    args = (list(args[0]), *args[1:])
                _check_str_method(getattr(target, "__name__", ""), owner, args, kwargs)
            return _check_size(super().call(__context, __obj, *args, **kwargs), "a call's value")

    return BoundedEnvironment


def jinja_env():
    """One sandboxed, immutable, bounded environment with strict undefined names (lm-eval's choice); an undefined
    value fails even inside a rendered list (`{{[a, b]}}` calls repr, which plain StrictUndefined allows)."""
    global _ENV
    if _ENV is None:
        import jinja2

        class Strict(jinja2.StrictUndefined):
            __slots__ = ()
            __repr__ = jinja2.StrictUndefined._fail_with_undefined_error

        env = _environment_class()(undefined=Strict, keep_trailing_newline=True)
        env.globals.pop("lipsum", None)  # lorem ipsum of any length: nothing a task needs
        env.filters["regex_replace"] = regex_replace
        env.filters["strip"] = _strip
        env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
        env.filters["_loop_guard"] = _guard
        _ENV = env
    return _ENV


def render(template, row: Any) -> str:
    """A compiled template over a row, within the time and size limits (TemplateLimit past them)."""
    with bounded():
        return template.render(**row) if isinstance(row, dict) else template.render()


def evaluate(expression, row: dict) -> Any:
    """A compiled expression over a row, within the time and size limits (TemplateLimit past them)."""
    with bounded():
        return _check_size(expression(**row), "the expression's value")


def template_names(source: str) -> tuple[str, ...]:
    """The names a template (or expression wrapped as `{{ ... }}`) reads from the row."""
    from jinja2 import meta

    env = jinja_env()
    return tuple(sorted(meta.find_undeclared_variables(env.parse(source)) - set(env.globals)))
