"""Which inputs share a scoring forward: the inputs sorted longest first, cut into consecutive batches of at most
`max_rows` rows where the padded tokens plus a fixed cost per forward are least.

Why: a batch pads every row to its longest input, so cutting fixed chunks of `max_rows` from the longest puts a
few long inputs with many short ones. On a CPU a forward costs about a fixed part plus a constant per padded token:
SmolLM2 behind a 160-token prefix on two threads, 1 row x 32 tokens 61 ms, 16 x 16 280 ms, 16 x 32 602 ms, 32 x 32
1,068 ms (nine shapes in bench/MEASUREMENTS.md, 2026-12-06); their least-squares line is ~32 ms + ~1.0 ms a token, so
a forward is worth ~32 tokens. On the runner's own suffix widths of 64 SST-2 inputs (4-shot prompt, batch size 16)
the cuts below save ~6% of that cost in one call and ~10% in two calls of 32 (what a server with 32 clients gets), and
they stay within 1% of that for any assumed forward cost from 20 to 100 tokens. Measured (bench/bench_length_batches.py):
0.996x and 0.956x the time, neither interval clear of 1: the forward is not all of a call. On a GPU the fixed part (the
weights read once per forward) is larger and was not measured here: a runner there keeps the fixed chunks
(`overhead` None).
"""

from __future__ import annotations

from collections.abc import Sequence

CPU_FORWARD_TOKENS = 32.0  # a CPU forward's fixed cost in padded tokens (the measurements above)


def length_batches(lengths: Sequence[int], max_rows: int, overhead: float | None) -> list[int]:
    """The sizes of consecutive batches over `lengths` (sorted longest first), each at most `max_rows`: fixed
    chunks of `max_rows` when `overhead` is None, else the cuts that minimise Σ (overhead + rows x longest)."""
    n = len(lengths)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if any(a < b for a, b in zip(lengths, lengths[1:])):
        raise ValueError("lengths must be sorted longest first")
    if overhead is None or n <= 1:
        return [min(max_rows, n - i) for i in range(0, n, max_rows)]
    best = [0.0] + [float("inf")] * n  # best[j]: the least cost of the first j inputs
    cut = [0] * (n + 1)  # where the last batch of the first j inputs starts
    for j in range(1, n + 1):
        for i in range(max(0, j - max_rows), j):  # the batch lengths[i:j] is padded to lengths[i]
            cost = best[i] + overhead + (j - i) * lengths[i]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    sizes, j = [], n
    while j > 0:
        sizes.append(j - cut[j])
        j = cut[j]
    return sizes[::-1]


__all__ = ["CPU_FORWARD_TOKENS", "length_batches"]
