"""Binomial statistics: the Wilson score interval of a proportion, the exact McNemar test on paired per-item
correctness and its form for several seeds' answers to the same items (an exact sign-flip test on per-item mean
differences), and the distribution-free interval of a median (order statistics, binomial coverage)."""

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


def paired_test_name(n_seeds: int) -> str:
    """What `clustered_paired_exact` computes for `n_seeds` seeds, as tables and the report name it."""
    return "exact McNemar" if n_seeds <= 1 else f"exact sign-flip over items ({n_seeds} seeds)"


def clustered_paired_exact(a, b) -> tuple[int, int, float]:
    """Exact two-sided paired test of right/wrong answers over several seeds of the same items, clustered by item:
    (only a correct, only b correct — counted over (seed, item) pairs —, p).

    `a`, `b`: (n_seeds, n_items) correctness. The seeds of one item are not independent samples (a baseline's one
    set of answers repeated per seed least of all), so the unit is the item: d_i = Σ_seeds (a − b) on item i, and
    under H0 each item's d_i is as likely to be −d_i (a and b swapped on that item, all its seeds at once). p is
    P(|Σ ±|d_i|| ≥ |Σ d_i|) over the 2^n sign flips, computed exactly: the items with |d_i| = k contribute
    k · (2·Binomial(c_k, ½) − c_k), and those few distributions are convolved on integers. With one seed every d_i
    is 0 or ±1 and this is McNemar's exact test (`mcnemar_exact`) to the last bit; seeds that repeat the same
    answers change nothing (every d_i scales by the seed count)."""
    import numpy as np
    from scipy.stats import binom

    a, b = np.atleast_2d(np.asarray(a, dtype=bool)), np.atleast_2d(np.asarray(b, dtype=bool))
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    if a.shape[0] == 1:
        return mcnemar_exact(a[0], b[0])
    d = a.sum(axis=0).astype(int) - b.sum(axis=0).astype(int)
    observed = abs(int(d.sum()))
    if observed == 0:
        return only_a, only_b, 1.0
    sizes, counts = np.unique(np.abs(d[d != 0]), return_counts=True)
    total = int((sizes * counts).sum())  # T ranges over −total..total; index t + total
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for k, c in zip(sizes.tolist(), counts.tolist()):
        part = np.zeros(2 * k * c + 1)  # k · (2j − c) for j heads of c: offsets 0, 2k, ..., 2kc from −kc
        part[:: 2 * k] = binom.pmf(np.arange(c + 1), c, 0.5)
        dist = np.convolve(dist, part)[k * c : k * c + 2 * total + 1]
    values = np.arange(-total, total + 1)
    return only_a, only_b, min(1.0, float(dist[np.abs(values) >= observed].sum()))
