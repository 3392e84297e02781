"""AUROC of a score for a binary label (Mann–Whitney), with percentile bootstrap intervals that resample answers, or
clusters of answers (an item with all its answers), every resample at once."""

from __future__ import annotations

from promptopt.metrics.stats.bootstrap import bootstrap_draws, percentile_interval


def auroc(scores, labels) -> float:
    """Area under the ROC curve of `scores` for the positive `labels` (Mann–Whitney: the share of (positive,
    negative) pairs the score orders correctly, ties counting half): scipy's U statistic of the positives
    (`scipy.stats.mannwhitneyu`) over n_pos · n_neg. Non-finite scores are left out; NaN when a class is empty."""
    import numpy as np
    from scipy.stats import mannwhitneyu

    scores, labels = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    keep = np.isfinite(scores)
    scores, labels = scores[keep], labels[keep]
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    u = mannwhitneyu(scores[labels], scores[~labels], method="asymptotic").statistic  # the p-value is not read
    return float(u / (n_pos * n_neg))


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
