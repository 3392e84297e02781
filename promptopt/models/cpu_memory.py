"""Keep the memory a CPU run frees inside the process, instead of handing it back to the kernel.

A forward on CPU allocates and frees activation tensors of a few megabytes, layer after layer. glibc's malloc
serves them from fresh mmap regions, or trims its heap as soon as they are freed, until its thresholds have
adapted to the sizes it sees; every page of such a region is faulted in (and zeroed by the kernel) again on the
next touch. Measured on SmolLM2, 200 SST-2 items, in fresh processes: 170,000-780,000 minor page faults in the
first scoring call (up to 3 GB of page touching, ~0.85 µs a fault here); with the thresholds below set when the
runner starts, 85,000-140,000 (the model's own first touches), and the resident size afterwards the same
(1.35-1.53 GB either way).

The setting: blocks up to 32 MB come from the heap (glibc's own ceiling for its adaptive threshold, so no
larger block than it would eventually keep), and the heap keeps up to 256 MB of freed memory at its top. It is
process-wide; the runner applies it when it runs a model on the CPU (a GPU run allocates its tensors on the
device, where it changes nothing).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks up to this size come from the heap, not from mmap
TRIM_THRESHOLD = 256 << 20  # the heap keeps up to this much free memory at its top

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when they are set (glibc on Linux)."""
    global _applied
    if _applied is None:
        _applied = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                mallopt = libc.mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
    return _applied
