"""Statistics for reporting: Wilson score intervals, exact McNemar, the item bootstrap and its intervals, the
robustness metrics (PDR, AccVar, worst case, FormatSpread), correlations and AUROC.

- binomial.py: Wilson interval, exact McNemar, the median's order-statistic interval
- bootstrap.py: seeded item resamples and percentile intervals · robustness.py: PDR, Acc_worst, AccVar, FormatSpread
- correlation.py: ranks, Spearman, Pearson, their intervals, log fit · roc.py: AUROC and its (clustered) intervals
- selection.py: the one rule that chooses among candidates on dev (a paired tie set, then a named tie-break) and the
  smallest difference a dev size detects (imported from there, not re-exported here: callers name it)

Which numbers come from where. From scipy, where scipy has the very statistic: the exact McNemar p-value
(`mcnemar_exact`: `scipy.stats.binomtest(min(n01, n10), n01 + n10, 0.5).pvalue`), Spearman's ρ (`spearman`:
`scipy.stats.spearmanr`), Pearson's r and its 95% Fisher-z interval (`pearson`, `pearson_interval`:
`scipy.stats.pearsonr(x, y).statistic` and `.confidence_interval()`), and AUROC (`auroc`: the Mann–Whitney U of
`scipy.stats.mannwhitneyu` over n_pos · n_neg). promptopt computed these itself before; AUROC is the same to the last
bit, the others agree to 4e-14 relative or better and to every digit printed (tests/metrics/test_stats.py pins the earlier
outputs). Our own code, where scipy has no function for the same number: the seeded item bootstrap every interval
here shares (`bootstrap_resamples`: one generator, so paired statistics and several numbers read the same resamples;
`scipy.stats.bootstrap` draws its own, so it could not reproduce a recorded interval) and its percentile intervals —
of the robustness metrics, of Spearman's ρ (`spearman_interval`), of AUROC (`auroc_interval`,
`clustered_auroc_interval`), of FormatSpread, and compare's clustered paired bootstrap over (seed, item)
(`workflows.compare.paired.cluster_resamples`), which no library has; the robustness metrics themselves (PDR,
Acc_worst, AccVar_pert, FormatSpread); the Bonett–Wright interval of Spearman's ρ and the Fisher-z interval from r
and n alone (`correlation_interval`); the median's distribution-free interval with its exact coverage
(`median_interval`); the log fit (`fit_log`, numpy's least squares); tied ranks over many resamples at once
(`average_ranks`). Kept ours although scipy has the formula: the Wilson interval (`wilson_interval`;
`scipy.stats.binomtest(k, n).proportion_ci(method="wilson")` differs in the last bit for about half of all (k, n),
and a Wilson lower bound gates selections — dev accuracy at or above the best trial's — where a last-bit change could
move a choice).
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
    pearson_interval,
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
    "pearson_interval",
    "percentile_interval",
    "performance_drop_rate",
    "robustness_intervals",
    "robustness_metrics",
    "spearman",
    "spearman_interval",
    "wilson_interval",
    "worst_case",
]
