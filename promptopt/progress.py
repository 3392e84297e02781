"""Progress of long work, on stderr: a bar on a terminal, one line per step otherwise, nothing with `--quiet`.

A command turns it on for its own duration (`reporting("export", quiet=...)`, used by the CLI); library code
reports through `step`, `iterate` and `enabled`, and says nothing when no command turned it on (a library
user's default, and every test that does not ask for it). stderr is looked up at each write, so a caller that
redirects it (tests, `contextlib.redirect_stderr`) gets the lines.

- `step(text)`: one line, "export: scoring the card on 40 test items" (on a terminal printed above any bar).
- `iterate(items, desc)`: a tqdm bar on a terminal; otherwise one line as each item starts
  ("evaluate: family 2/4 typo"), so a log shows where a run is and what it was doing when it stopped.
- `meter(desc, total, unit)`: the inside of one long loop (a model's decoding steps, its scoring batches): a line
  at most every `METER_SECONDS` and never before, with what is done, the time so far and an estimate of what
  remains ("stress: rank 2 (3/5): generating 1/3 items (step 140/512), 41 s so far, about 1 min 50 s left"), so
  no command is silent for more than a few seconds however long one step of it takes. `stage(text)` names the
  part of the command such lines belong to.
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
    stage: str | None = None  # the part of the command a meter's lines belong to ("rank 2 (3/5)")


METER_SECONDS = 5.0  # a meter's lines: at most this often, the first after this long (a short loop says nothing)


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


@contextmanager
def stage(text: str):
    """Meter lines inside the block say which part of the command they belong to (`<command>: <text>: ...`)."""
    if _current is None:
        yield
        return
    reporter, outer = _current, _current.stage
    reporter.stage = text
    try:
        yield
    finally:
        reporter.stage = outer


def duration(seconds: float) -> str:
    """'8 s', '3 min 05 s', '1 h 02 min'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Meter:
    """Progress inside one long loop: `update(done)` as work is done; a line at most every `METER_SECONDS`
    (none for a loop that ends sooner) with the count, the time so far and the time left, estimated from the
    share of the work done (`fraction`, default done / total) at the rate so far."""

    def __init__(self, desc: str, total: int | None, unit: str, *, warmup: bool = False) -> None:
        """`warmup`: the time before the first `update` is a one-off (a prompt's prefill before the first decoding
        step), so the time left is estimated at the pace from the first update on, not from the start."""
        self.desc, self.total, self.unit = desc, total, unit
        self.start = self.last = time.perf_counter()
        self.origin: tuple[float, float] | None = None if warmup else (self.start, 0.0)
        self.lines = 0

    def update(self, done: int, *, fraction: float | None = None, note: str = "") -> None:
        if _current is None:
            return
        now = time.perf_counter()
        if fraction is None and self.total:
            fraction = done / self.total
        if self.origin is None:  # the end of the warm-up: the pace is measured from here
            self.origin = (now, fraction or 0.0)
        if now - self.last < METER_SECONDS or (fraction is not None and fraction >= 1):
            return  # too soon after the last line, or the loop's end (the command's next line says what follows)
        self.last = now
        counted = f"{done}/{self.total}" if self.total is not None else str(done)
        text = f"{self.desc} {counted} {self.unit}{note}, {duration(now - self.start)} so far"
        since, before = self.origin
        if fraction is not None and fraction > before and now > since:
            pace = (now - since) / (fraction - before)  # seconds per whole job
            text += f", about {duration(pace * (1 - min(fraction, 1.0)))} left"
        self.lines += 1
        step(f"{_current.stage}: {text}" if _current.stage else text)


def meter(desc: str, total: int | None, unit: str, *, warmup: bool = False) -> Meter:
    return Meter(desc, total, unit, warmup=warmup)


__all__ = ["METER_SECONDS", "Meter", "bars", "duration", "enabled", "iterate", "meter", "reporting", "stage", "step"]
