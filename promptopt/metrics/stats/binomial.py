"""Binomial statistics: the Wilson score interval of a proportion, the exact McNemar test on paired per-item
correctness, and the distribution-free interval of a median (order statistics, binomial coverage)."""

from __future__ import annotations

import math

_Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (nan, nan) when n = 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def median_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free interval for the median of `values` (a few timings, say): the order statistics x(k) and
    x(n+1-k), k the largest whose coverage 1 − 2·P(Binomial(n, ½) < k) is still ≥ `level`; returns (low, high,
    coverage). Below 6 values no k reaches 95%, and the range is returned with its own coverage (93.75% for 5)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), float("nan")

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def mcnemar_exact(a, b) -> tuple[int, int, float]:
    """Exact two-sided McNemar test on paired per-item correctness: (only a correct, only b correct, p).

    Under H0 the discordant items split as Binomial(n, 1/2); p = min(1, 2·P(X ≤ min(n01, n10))), scipy's exact
    two-sided binomial test (`scipy.stats.binomtest`; for p = ½ its two tails are this doubled tail)."""
    import numpy as np
    from scipy.stats import binomtest

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n = only_a + only_b
    if n == 0:
        return only_a, only_b, 1.0
    return only_a, only_b, min(1.0, float(binomtest(min(only_a, only_b), n, 0.5).pvalue))
