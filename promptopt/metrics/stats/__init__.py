"""Statistics for reporting: Wilson score intervals, exact McNemar, the item bootstrap and its intervals, the
robustness metrics (PDR, AccVar, worst case, FormatSpread), correlations and AUROC.

- binomial.py: Wilson interval, exact McNemar, the median's order-statistic interval
- bootstrap.py: seeded item resamples and percentile intervals · robustness.py: PDR, Acc_worst, AccVar, FormatSpread
- correlation.py: ranks, Spearman, Pearson, their intervals, log fit · roc.py: AUROC and its (clustered) intervals
"""

from promptopt.metrics.stats.binomial import mcnemar_exact, median_interval, wilson_interval
from promptopt.metrics.stats.bootstrap import (
    bootstrap_draws,
    bootstrap_interval,
    bootstrap_intervals,
    bootstrap_resamples,
    percentile_interval,
)
from promptopt.metrics.stats.correlation import (
    average_ranks,
    correlation_interval,
    fit_log,
    pearson,
    spearman,
    spearman_interval,
)
from promptopt.metrics.stats.robustness import (
    PerItemRobustness,
    accuracy_variance,
    format_spread,
    performance_drop_rate,
    robustness_intervals,
    robustness_metrics,
    worst_case,
)
from promptopt.metrics.stats.roc import auroc, auroc_interval, clustered_auroc_interval

__all__ = [
    "PerItemRobustness",
    "accuracy_variance",
    "auroc",
    "auroc_interval",
    "average_ranks",
    "bootstrap_draws",
    "bootstrap_interval",
    "bootstrap_intervals",
    "bootstrap_resamples",
    "clustered_auroc_interval",
    "correlation_interval",
    "fit_log",
    "format_spread",
    "mcnemar_exact",
    "median_interval",
    "pearson",
    "percentile_interval",
    "performance_drop_rate",
    "robustness_intervals",
    "robustness_metrics",
    "spearman",
    "spearman_interval",
    "wilson_interval",
    "worst_case",
]
