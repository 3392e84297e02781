"""Correlations: ranks with ties, Spearman and Pearson with their intervals, and a logarithmic least-squares fit."""

from __future__ import annotations

import math

from promptopt.metrics.stats.bootstrap import bootstrap_resamples, percentile_interval


def average_ranks(values):
    """1-based ranks with ties sharing their average rank (pandas' `rank()`, scipy's `rankdata`), along the last
    axis, in numpy: a bootstrap ranks thousands of resamples, one row each, where a pandas Series per resample
    would cost more than the sort."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    order = np.argsort(values, axis=-1, kind="mergesort")
    ordered = np.take_along_axis(values, order, -1)
    position = np.broadcast_to(np.arange(n), values.shape)
    starts = np.ones(values.shape, dtype=bool)  # where a run of tied values starts
    starts[..., 1:] = ordered[..., 1:] != ordered[..., :-1]
    ends = np.ones(values.shape, dtype=bool)  # where one ends
    ends[..., :-1] = starts[..., 1:]
    first = np.maximum.accumulate(
        np.where(starts, position, 0), axis=-1
    )  # each position's run: first and last position
    last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, position, n), -1), axis=-1), -1)
    ranks = np.empty(values.shape)
    np.put_along_axis(ranks, order, (first + last + 2) / 2, -1)  # mean of the 1-based positions first+1 … last+1
    return ranks


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties), `scipy.stats.spearmanr`; NaN when either side is constant
    or has a NaN, or there are fewer than 2 pairs (infinities are ranked, as the largest or smallest values)."""
    import numpy as np
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any() or _constant(x) or _constant(y):
        return float("nan")
    return float(spearmanr(x, y).statistic)


def spearman_interval(x, y, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """`bootstrap_interval(lambda idx: spearman(x[idx], y[idx]), len(x), …)`, its resamples ranked and correlated
    all at once instead of one Python call each (a proxy table runs 24 of them). The same resamples and the same
    NaN rule (a resample where either side is constant, or any NaN); each resample's ρ is the same number up to
    the last bits of the sums."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any():
        return float("nan"), float("nan")
    resamples = bootstrap_resamples(len(x), n_boot=n_boot, seed=seed)
    rx, ry = average_ranks(x[resamples]), average_ranks(y[resamples])
    rx -= rx.mean(-1, keepdims=True)
    ry -= ry.mean(-1, keepdims=True)
    sxx, syy = (rx * rx).sum(-1), (ry * ry).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.clip((rx * ry).sum(-1) / np.sqrt(sxx * syy), -1.0, 1.0)
    return percentile_interval(np.where((sxx > 0) & (syy > 0), rho, np.nan), level)


def pearson(x, y) -> float:
    """Pearson correlation, `scipy.stats.pearsonr`; NaN when either side is constant or not finite, or there are
    fewer than 2 pairs."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()) or _constant(x) or _constant(y):
        return float("nan")
    return float(_pearsonr(x, y).statistic)


def pearson_interval(x, y, *, level: float = 0.95) -> tuple[float, float]:
    """The Fisher-z interval of `pearson(x, y)`, tanh(atanh r ± z/sqrt(n − 3)): scipy's
    (`pearsonr(x, y).confidence_interval()`). (nan, nan) where `pearson` is NaN or n ≤ 3."""
    r = pearson(x, y)
    if len(x) <= 3 or r != r:
        return float("nan"), float("nan")
    interval = _pearsonr(x, y).confidence_interval(confidence_level=level)
    return float(interval.low), float(interval.high)


def _pearsonr(x, y):
    """scipy's Pearson result, quiet about nearly constant data (np.corrcoef, which this replaced, said nothing)."""
    import warnings

    import numpy as np
    from scipy.stats import NearConstantInputWarning, pearsonr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NearConstantInputWarning)
        return pearsonr(np.asarray(x, dtype=float), np.asarray(y, dtype=float))


def _constant(values) -> bool:
    """All values equal: no correlation is defined (scipy would warn and give NaN)."""
    return bool((values == values[0]).all())


def correlation_interval(r: float, n: int, *, method: str = "pearson", level: float = 0.95) -> tuple[float, float]:
    """Fisher-z interval for a correlation from r and n alone: tanh(atanh r ± z/sqrt(n − 3)); for Spearman the
    Bonett–Wright standard error sqrt((1 + r²/2)/(n − 3)), which scipy does not give. (nan, nan) when n ≤ 3 or r is
    NaN. With the data at hand, Pearson's is `pearson_interval` (scipy's)."""
    from statistics import NormalDist

    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be pearson or spearman, got {method!r}")
    if n <= 3 or r != r:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    se = math.sqrt((1 + r * r / 2) / (n - 3)) if method == "spearman" else 1 / math.sqrt(n - 3)
    centre = math.atanh(max(-0.999999999999, min(0.999999999999, r)))
    return math.tanh(centre - z * se), math.tanh(centre + z * se)


def fit_log(x, y) -> dict:
    """Least-squares y ≈ a + b·ln x with its R² (the Taboo paper's "ΔS grows roughly logarithmically with i")."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[keep], y[keep]
    if len(x) < 2 or np.ptp(np.log(x)) == 0:
        return {"a": float("nan"), "b": float("nan"), "r2": float("nan"), "n": int(len(x))}
    b, a = np.polyfit(np.log(x), y, 1)
    resid = y - (a + b * np.log(x))
    total = ((y - y.mean()) ** 2).sum()
    r2 = 1 - (resid**2).sum() / total if total > 0 else float("nan")
    return {"a": float(a), "b": float(b), "r2": float(r2), "n": int(len(x))}
