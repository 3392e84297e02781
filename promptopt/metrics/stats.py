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
