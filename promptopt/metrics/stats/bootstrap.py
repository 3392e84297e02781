"""The item bootstrap every interval here shares: seeded resamples of item indices (the same seed gives the same
resamples, whichever statistic reads them), percentile intervals, and several numbers from one pass."""

from __future__ import annotations


def bootstrap_interval(statistic, n_items: int, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95):
    """Percentile interval of `statistic(index_array)` over items resampled with replacement.

    The statistic receives the resampled item indices, so paired quantities (a difference between two
    prompts on the same items, a robustness metric over an item and its variants) resample together.
    Seeded: the same call gives the same interval. NaN resamples are dropped."""
    return bootstrap_intervals(
        lambda index: (statistic(index),), n_items, names=("value",), n_boot=n_boot, seed=seed, level=level
    )["value"]


def bootstrap_intervals(
    statistic, n_items: int, *, names, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> dict:
    """`bootstrap_interval` for a statistic that returns one number per name from each resample: name -> interval.

    The resamples are those of `bootstrap_interval` with the same seed, so each interval is what a separate call
    for that number gives; the statistic runs once a resample instead of once per number (a robustness metric
    computes all its numbers at once)."""
    import numpy as np

    names = list(names)
    if n_items == 0:
        return dict.fromkeys(names, (float("nan"), float("nan")))
    resamples = bootstrap_resamples(n_items, n_boot=n_boot, seed=seed)
    values = np.array([statistic(index) for index in resamples], dtype=float).reshape(n_boot, len(names))
    return {name: percentile_interval(column, level) for name, column in zip(names, values.T)}


def bootstrap_resamples(n_items: int, *, n_boot: int = 2000, seed: int = 0):
    """The resampled item indices of every bootstrap here, (n_boot, n_items): row b is resample b of
    `bootstrap_interval` with the same seed (numpy draws the matrix at once as the same stream as row by row)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, n_items, (n_boot, n_items))


def bootstrap_draws(n_items: int, *, n_boot: int = 2000, seed: int = 0):
    """How often each item is drawn in each of `bootstrap_resamples`' resamples, (n_boot, n_items) integers: a
    statistic that is a sum over the resampled items is then one matrix product for every resample."""
    import numpy as np

    offsets = n_items * np.arange(n_boot)[:, None]
    drawn = bootstrap_resamples(n_items, n_boot=n_boot, seed=seed) + offsets
    return np.bincount(drawn.ravel(), minlength=n_boot * n_items).reshape(n_boot, n_items)


def percentile_interval(values, level: float = 0.95) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap values, NaN resamples dropped ((nan, nan) if none is left)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    alpha = (1 - level) / 2
    return float(np.quantile(values, alpha)), float(np.quantile(values, 1 - alpha))
