"""Progress of long work, on stderr: a bar on a terminal, one line per step otherwise, nothing with `--quiet`.

A command turns it on for its own duration (`reporting("export", quiet=...)`, used by the CLI); library code
reports through `step`, `iterate` and `enabled`, and says nothing when no command turned it on (a library
user's default, and every test that does not ask for it). stderr is looked up at each write, so a caller that
redirects it (tests, `contextlib.redirect_stderr`) gets the lines.

- `step(text)`: one line, "export: scoring the card on 40 test items" (on a terminal printed above any bar).
- `iterate(items, desc)`: a tqdm bar on a terminal; otherwise one line as each item starts
  ("evaluate: family 2/4 typo"), so a log shows where a run is and what it was doing when it stopped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class _Reporter:
    command: str
    bar: bool  # a terminal: tqdm bars (steps are still lines)
    started: float


_current: _Reporter | None = None


def _stream():
    return sys.stderr


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def reporting(command: str, *, quiet: bool = False):
    """Progress on for `command` until the block ends (off with `quiet`); nests by keeping the outer one."""
    global _current
    outer = _current
    if outer is None and not quiet:
        _current = _Reporter(command, _is_terminal(_stream()), time.perf_counter())
    elif quiet:
        _current = None
    try:
        yield
    finally:
        _current = outer


def enabled() -> bool:
    return _current is not None


def bars() -> bool:
    """Whether progress is drawn as bars (a terminal): the runner's own tqdm bars may show then."""
    return _current is not None and _current.bar


def step(text: str) -> None:
    """One progress line: `<command>: <text>`."""
    if _current is None:
        return
    line = f"{_current.command}: {text}"
    if _current.bar:
        from tqdm.auto import tqdm

        tqdm.write(line, file=_stream())
    else:
        stream = _stream()
        stream.write(line + "\n")  # one write per line: lines from several threads never interleave mid-line
        stream.flush()


def iterate(items: Iterable, desc: str, *, total: int | None = None, label=None) -> Iterator:
    """`items`, reporting each as it starts: a bar on a terminal, else `desc i/n [label(item)]` per item."""
    if _current is None:
        yield from items
        return
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if _current.bar:
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=f"{_current.command}: {desc}", total=total, leave=False, file=_stream())
        return
    for i, item in enumerate(items, 1):
        name = f" {label(item)}" if label is not None else ""
        step(f"{desc} {i}/{total if total is not None else '?'}{name}")
        yield item


__all__ = ["bars", "enabled", "iterate", "reporting", "step"]
