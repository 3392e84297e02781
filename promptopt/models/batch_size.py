"""`--batch-size auto`: the largest batch that fits, found by halving on out-of-memory.

As lm-evaluation-harness's `--batch_size auto` and accelerate's `find_executable_batch_size` (which does the
retrying here): a runner asked for `auto` starts at `AUTO_START` rows per forward pass; a call that runs out of
memory (CUDA, MPS, XPU, or a CPU allocation that fails: accelerate's `should_reduce_batch_size`) is run again, whole,
at half the rows, until it fits; the size that fitted is kept for the runner's later calls. A call's results do not
depend on its batch size (only on the items), so a retried call returns what a call at that size from the start
returns. On a CPU the kernel may kill a process that over-commits memory before any allocation fails: there `auto`
halves only when the allocator reports the failure. The size a call settled on is said in one `note:` line on
stderr (again only if a later call had to halve it): a user who asked for `auto` learns what it chose.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from promptopt.errors import UserError

AUTO = "auto"
AUTO_START = 64  # lm-eval's default --max_batch_size for auto
T = TypeVar("T")


def parse_batch_size(value, where: str = "--batch-size") -> int | str:
    """A positive integer or "auto"; anything else is one UserError naming `where`."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or (isinstance(value, float) and value != number):
        raise UserError(f"{where} {value!r}: expected a positive integer or auto")
    return number


def auto_note(size: int) -> str:
    """The note `--batch-size auto` prints once it has settled on a size."""
    halved = f" (halved from {AUTO_START} on out-of-memory)" if size < AUTO_START else ""
    return f"--batch-size auto: {size} rows per forward pass{halved}"


def print_auto_note(size: int) -> None:
    print(f"note: {auto_note(size)}", file=sys.stderr, flush=True)  # a result, even for a quiet run


def run_fitting(
    call: Callable[[], T],
    *,
    get: Callable[[], int],
    set_: Callable[[int], None],
    said: Callable[[], int | None] | None = None,
    say: Callable[[int], None] | None = None,
) -> T:
    """`call()` at the batch size `get()` returns; on out-of-memory, `set_` half of it and call again (accelerate's
    find_executable_batch_size). Out of memory at one row is one UserError. Once a call succeeds, a size other than
    `said()` (the last one announced) is announced with `say` (default: `auto_note` on stderr)."""
    from accelerate.utils import find_executable_batch_size

    def halve() -> int:
        set_(get() // 2)
        return get()

    @find_executable_batch_size(starting_batch_size=get(), reduce_batch_size_fn=halve)
    def attempt(batch_size: int) -> T:
        set_(batch_size)
        return call()

    try:
        result = attempt()
    except RuntimeError as exc:
        if "No executable batch size found" in str(exc):
            raise UserError("--batch-size auto: out of memory even one row at a time") from None
        raise
    if said is None or said() != get():
        (say or print_auto_note)(get())
    return result


__all__ = ["AUTO", "AUTO_START", "auto_note", "parse_batch_size", "print_auto_note", "run_fitting"]
