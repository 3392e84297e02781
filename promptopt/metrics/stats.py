"""Statistics for reporting: Wilson score intervals and the robustness metrics (PDR, AccVar, worst case)."""

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


def performance_drop_rate(acc_clean: float, acc_perturbed: float) -> float:
    """PDR = 1 − Acc_perturbed / Acc_clean (PromptBench). Negative when perturbation helps; NaN when
    Acc_clean = 0, where the ratio is undefined (callers report it as such)."""
    if acc_clean == 0:
        return float("nan")
    return 1.0 - acc_perturbed / acc_clean


def accuracy_variance(accuracies: list[float]) -> float:
    """AccVar_pert: population variance of the per-family perturbed accuracies."""
    if not accuracies:
        return float("nan")
    mean = sum(accuracies) / len(accuracies)
    return sum((a - mean) ** 2 for a in accuracies) / len(accuracies)


def worst_case(accuracies: dict[str, float]) -> tuple[str | None, float]:
    """Acc_worst and the family it comes from (NaN values ignored)."""
    valid = {k: v for k, v in accuracies.items() if v == v}
    if not valid:
        return None, float("nan")
    family = min(valid, key=lambda k: (valid[k], k))
    return family, valid[family]


# --- paired comparisons ------------------------------------------------------------------------------
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

    Under H0 the discordant items split as Binomial(n, 1/2); p = min(1, 2·P(X ≤ min(n01, n10)))."""
    import numpy as np

    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in shape: {a.shape} vs {b.shape}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n = only_a + only_b
    if n == 0:
        return only_a, only_b, 1.0
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2**n
    return only_a, only_b, min(1.0, 2 * tail)


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


def auroc(scores, labels) -> float:
    """Area under the ROC curve of `scores` for the positive `labels` (Mann–Whitney: the share of (positive,
    negative) pairs the score orders correctly, ties counting half). NaN when a class is empty."""
    import numpy as np

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    keep = np.isfinite(scores)
    scores, labels = scores[keep], labels[keep]
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


_AUROC_BLOCK = 1 << 22  # resamples × answers weighed at once in `clustered_auroc_interval` (~32 MB a matrix)


def auroc_interval(scores, labels, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `auroc`, resampling answers: `bootstrap_interval` of it, every resample at
    once (`clustered_auroc_interval` with one answer per cluster)."""
    import numpy as np

    return clustered_auroc_interval(scores, labels, np.arange(len(scores)), n_boot=n_boot, seed=seed)


def clustered_auroc_interval(scores, labels, cluster, *, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of `auroc` resampling clusters of answers (an item with all its answers, whose
    answers are not independent): `cluster[i]` in 0..C-1 is answer i's; the resamples are `bootstrap_interval`'s over
    C clusters. Every resample at once: its AUROC is the Mann–Whitney count of its answers, each counted as often as
    its cluster was drawn, which is what ranking the concatenated answers gives. Both are exact in float64 (counts of
    pairs, halves for ties), so the interval is the per-resample loop's bit for bit. Non-finite scores are left out;
    a resample without a positive or a negative answer has no AUROC (dropped)."""
    import numpy as np

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    cluster = np.asarray(cluster, dtype=int)
    keep = np.isfinite(scores)
    if not keep.any():
        return float("nan"), float("nan")
    order = np.argsort(scores[keep], kind="mergesort")
    ordered, positive, owner = scores[keep][order], labels[keep][order], cluster[keep][order]
    ties = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # where each run of tied scores starts
    areas = []
    draws = bootstrap_draws(int(cluster.max()) + 1, n_boot=n_boot, seed=seed)
    step = max(1, _AUROC_BLOCK // len(ordered))  # resamples per block
    for start in range(0, n_boot, step):
        weight = draws[start : start + step][:, owner].astype(float)  # (block, answers), in score order
        pos = np.add.reduceat(np.where(positive, weight, 0.0), ties, axis=1)  # per run of tied scores
        neg = np.add.reduceat(np.where(positive, 0.0, weight), ties, axis=1)
        below = np.cumsum(neg, axis=1) - neg  # negatives scored lower than the run
        n_pos, n_neg = pos.sum(-1), neg.sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            area = (pos * (below + neg / 2)).sum(-1) / (n_pos * n_neg)
        areas.append(np.where((n_pos > 0) & (n_neg > 0), area, np.nan))
    return percentile_interval(np.concatenate(areas))


def format_spread(correct, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """FormatSpread (arXiv 2310.11324): max − min accuracy over the formats of one prompt, on the same items.

    correct: items × formats (0/1; NaN where an item has no variant in that format — those items are left out,
    so every format is measured on the same items). The interval resamples items (all formats of an item
    together), so it says how much of the spread the item sample alone could make."""
    import numpy as np

    matrix = np.asarray(correct, dtype=float)
    matrix = matrix[~np.isnan(matrix).any(axis=1)]
    n_items, n_formats = matrix.shape if matrix.ndim == 2 else (0, 0)
    if n_items == 0 or n_formats < 2:
        return {
            "spread": float("nan"),
            "ci95": [float("nan"), float("nan")],
            "n_items": int(n_items),
            "n_formats": int(n_formats),
        }
    accuracies = matrix.mean(axis=0)
    # every resample at once: its per-format sums are (how often each item was drawn) · matrix, integers as exact in
    # float64 as the loop's sums over `matrix[idx]`, so the interval is `bootstrap_interval`'s bit for bit
    sums = bootstrap_draws(n_items, n_boot=n_boot, seed=seed).astype(float) @ matrix
    low, high = percentile_interval(np.ptp(sums / n_items, axis=-1))
    return {
        "spread": float(np.ptp(accuracies)),
        "ci95": [low, high],
        "n_items": int(n_items),
        "n_formats": int(n_formats),
        "accuracies": [float(a) for a in accuracies],
    }


# --- robustness over the same items --------------------------------------------------------------------
class PerItemRobustness:
    """Per-item counts behind every robustness metric: clean correctness, and per family the number of
    kept variants and how many were correct. Metrics on any (re)sample of items are a few reductions."""

    def __init__(self, clean, variants) -> None:
        import numpy as np
        import pandas as pd

        clean = pd.Series(clean, dtype=bool)
        v = (
            variants
            if isinstance(variants, pd.DataFrame)
            else pd.DataFrame(variants, columns=["item_id", "family", "correct"])
        )
        unknown = set(v["item_id"]) - set(clean.index)
        if unknown:
            raise ValueError(f"variants of items without a clean result: {sorted(unknown)[:3]}")
        self.items = list(clean.index)
        self.families = sorted(v["family"].unique()) if len(v) else []
        row = {item: i for i, item in enumerate(self.items)}
        col = {family: j for j, family in enumerate(self.families)}
        self.clean = clean.to_numpy(dtype=float)
        self.n = np.zeros((len(self.items), len(self.families)))
        self.k = np.zeros_like(self.n)
        for item, family, correct in zip(v["item_id"], v["family"], v["correct"].astype(bool)):
            self.n[row[item], col[family]] += 1
            self.k[row[item], col[family]] += correct

    def metrics(self, index=None) -> dict:
        import numpy as np

        idx = np.arange(len(self.items)) if index is None else np.asarray(index)
        clean, n, k = self.clean[idx], self.n[idx], self.k[idx]
        out = {"acc_clean": float(clean.mean()) if len(idx) else float("nan")}
        family_acc, family_pdr = {}, {}
        for j, family in enumerate(self.families):
            touched = n[:, j] > 0
            if not touched.any():
                family_acc[family] = family_pdr[family] = float("nan")
                continue
            family_acc[family] = float(k[:, j].sum() / n[:, j].sum())
            family_pdr[family] = performance_drop_rate(float(clean[touched].mean()), family_acc[family])
        defined = [x for x in family_pdr.values() if x == x]
        n_item, k_item = n.sum(1), k.sum(1)
        out["pdr"] = float(np.mean(defined)) if defined else float("nan")
        out["pdr_pooled"] = (
            performance_drop_rate(float((clean * n_item).sum() / n_item.sum()), float(k_item.sum() / n_item.sum()))
            if n_item.sum()
            else float("nan")
        )
        all_ok = k_item == n_item
        out["acc_worst"] = float((clean.astype(bool) & all_ok).mean()) if len(idx) else float("nan")
        worst_family, out["acc_worst_family_min"] = worst_case(family_acc)
        out["acc_worst_family"] = worst_family
        versions = 1 + n_item  # the clean version and every kept variant
        mean = (clean + k_item) / versions
        out["acc_var"] = float((mean * (1 - mean)).mean()) if len(idx) else float("nan")  # Bernoulli variance per item
        out["acc_var_families"] = accuracy_variance([x for x in family_acc.values() if x == x])
        out["pdr_by_family"] = family_pdr
        out["acc_by_family"] = family_acc
        return out

    def resampled_metrics(self, resamples) -> dict:
        """acc_worst, acc_var, pdr and pdr_pooled of every resample (rows of item indices) at once, an array each:
        `metrics(row)`'s numbers, the same sums in the same order, without a Python call per resample. Rows go in
        blocks that keep the (rows, items, families) arrays near 2^21 numbers, whatever the sizes."""
        import numpy as np

        resamples = np.asarray(resamples)
        rows = max(1, (1 << 21) // max(1, resamples.shape[1] * len(self.families)))
        parts = [self._resampled_block(resamples[start : start + rows]) for start in range(0, len(resamples), rows)]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]} if parts else {}

    def _resampled_block(self, resamples) -> dict:
        import numpy as np

        clean, n, k = (
            self.clean[resamples],
            self.n[resamples],
            self.k[resamples],
        )  # (rows, items) and (rows, items, families)
        n_item, k_item = n.sum(-1), k.sum(-1)
        mean = (clean + k_item) / (1 + n_item)
        touched = n > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            clean_touched = (clean[..., None] * touched).sum(1) / touched.sum(1)  # NaN for a family no item has
            family_pdr = 1.0 - (k.sum(1) / n.sum(1)) / clean_touched
            family_pdr[clean_touched == 0] = np.nan  # performance_drop_rate: undefined when the clean accuracy is 0
            defined = ~np.isnan(family_pdr)
            pdr = np.where(defined, family_pdr, 0.0).sum(-1) / defined.sum(-1)
            pooled_clean = (clean * n_item).sum(-1) / n_item.sum(-1)
            pdr_pooled = np.where(pooled_clean == 0, np.nan, 1.0 - (k_item.sum(-1) / n_item.sum(-1)) / pooled_clean)
        return {
            "acc_worst": (clean.astype(bool) & (k_item == n_item)).mean(-1),
            "acc_var": (mean * (1 - mean)).mean(-1),
            "pdr": pdr,
            "pdr_pooled": pdr_pooled,
        }


def robustness_metrics(clean, variants) -> dict:
    """Robustness of one prompt from per-item correctness, every metric on the same items.

    clean: mapping item_id -> correct on the clean prompt (every evaluated item).
    variants: rows (item_id, family, correct) for every kept perturbed variant.

    - acc_clean            = mean_i clean_i
    - pdr_by_family[f]     = 1 − acc(variants of f) / mean(clean_i | items f perturbed)
    - pdr (PromptBench)    = mean over families of their PDR (families where it is defined)
    - pdr_pooled           = 1 − acc(all variants) / mean(clean of each variant's item)
    - acc_worst            = mean_i [clean_i ∧ every kept variant of i correct]   (robust accuracy)
    - acc_worst_family_min = min over families of acc(variants of f)   (families cover unequal item sets)
    - acc_var              = mean_i Var(correctness over i's clean + perturbed versions)
    - acc_var_families     = population variance of the family accuracies
    """
    return PerItemRobustness(clean, variants).metrics()


def robustness_intervals(clean, variants, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """95% bootstrap intervals for acc_worst, acc_var, pdr and pdr_pooled, resampling items together
    with their variants (seeded: the same call gives the same interval)."""
    per_item = PerItemRobustness(clean, variants)
    names = ("acc_worst", "acc_var", "pdr", "pdr_pooled")
    if not per_item.items:
        return {f"{name}_ci95": [float("nan"), float("nan")] for name in names}
    together = per_item.resampled_metrics(bootstrap_resamples(len(per_item.items), n_boot=n_boot, seed=seed))
    return {f"{name}_ci95": list(percentile_interval(together[name])) for name in names}


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
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant or has a NaN."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.isnan(x).any() or np.isnan(y).any():
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])  # the pandas-ranked version's numbers, bit for bit


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


# --- correlations with intervals, dose-response fits -------------------------------------------------------
def pearson(x, y) -> float:
    """Pearson correlation; NaN when either side is constant or fewer than 2 pairs."""
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def correlation_interval(r: float, n: int, *, method: str = "pearson", level: float = 0.95) -> tuple[float, float]:
    """Fisher-z interval for a correlation: tanh(atanh r ± z/sqrt(n − 3)); for Spearman the Bonett–Wright
    standard error sqrt((1 + r²/2)/(n − 3)). (nan, nan) when n ≤ 3 or r is NaN."""
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
