"""A benchmark's verdict on a target from paired samples (ratios measured round by round): met or not by the
median, and whether the median's distribution-free interval lies on that side of the target. On this machine kind
the samples scatter by ±10%, and a median near the target can fall on either side in another run. Below 5 samples
the interval (the range) covers the median less than 90% of the time, too seldom to settle anything."""

from __future__ import annotations

import statistics

SETTLING_COVERAGE = 0.9  # the least coverage of the median's interval that may settle a target (5 samples: 93.75%)


def verdict(ratios, target: float, *, at_most: bool = False) -> str:
    """'target ≥ T: met; the median's 98% interval 0.82-0.93 contains it: not settled by this run' (≤ with
    `at_most`: lower is better)."""
    from promptopt.metrics.stats import median_interval

    low, high, coverage = median_interval(ratios)
    median = statistics.median(ratios)
    met = median <= target if at_most else median >= target
    # the interval's side of the target; the target itself counts on the side that meets it
    if coverage < SETTLING_COVERAGE:
        where = f"from {len(ratios)} sample{'s' * (len(ratios) > 1)}, too few to settle it"
    elif high < target or (at_most and high == target):
        where = "lies below it"
    elif low > target or (not at_most and low == target):
        where = "lies above it"
    else:
        where = "contains it: not settled by this run"
    sign = "≤" if at_most else "≥"
    return f"target {sign} {target}: {'met' if met else 'NOT met'}; the median's {coverage:.0%} interval {low:.3f}-{high:.3f} {where}"
