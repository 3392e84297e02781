"""The numbers a card records: a split's accuracy with its Wilson interval, δ_TCB and PPL with bootstrap intervals,
and the compare's robustness numbers of the winner; every value made JSON/YAML-safe (`clean`)."""

from __future__ import annotations

import math

_BOOTSTRAP = 2000


def clean(value):
    """JSON/YAML-safe: numpy scalars to Python, NaN and infinities to None."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def bootstrap_mean_ci(values, *, seed: int = 0, resamples: int = _BOOTSTRAP) -> list:
    """Percentile bootstrap 95% interval of the mean of the finite values (None where there are none)."""
    import numpy as np

    from promptopt.metrics.stats import bootstrap_interval

    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data)]
    if len(data) == 0:
        return [None, None]
    return list(bootstrap_interval(lambda idx: data[idx].mean(), len(data), n_boot=resamples, seed=seed))


def measured(table) -> dict:
    """A split's summary for the card: accuracy with its Wilson interval, δ_TCB and PPL with bootstrap
    intervals, and the per-item correctness string."""
    from promptopt.scoring import summarize

    s = summarize(table)
    out = {"n": s["n"], "accuracy": s["accuracy"], "accuracy_ci95": s["accuracy_ci95"]}
    if "tcb" in table:
        out.update(
            tcb_mean=s.get("tcb_mean"), tcb_mean_ci95=bootstrap_mean_ci(table["tcb"]), tcb_geomean=s.get("tcb_geomean")
        )
    out.update(ppl_mean=s["ppl_mean"], ppl_mean_ci95=bootstrap_mean_ci(table["ppl"]))
    out["correct"] = "".join("1" if bool(c) else "0" for c in table["correct"])
    return clean(out)


def robustness_section(row: dict | None, families: dict | None = None) -> dict | None:
    """The compare's robustness numbers of a winner, over all judged families and split seen/unseen (`families`:
    the compare summary's families_seen / families_unseen lists)."""
    from promptopt.workflows.compare.records import interval_columns

    measured = ("pdr", "acc_worst", "taboo_retention_i1")
    if not row or all(row.get(k) is None or (isinstance(row.get(k), float) and math.isnan(row[k])) for k in measured):
        return None  # compared without a suite: the columns exist but hold nothing
    keys = ("pdr", "acc_worst", "acc_worst_family", "acc_var_pert", "taboo_retention_i1")
    out = {"n": (families or {}).get("n_robust"), **{k: row.get(k) for k in keys}}
    for key in ("pdr", "acc_worst"):  # intervals, where compare recorded them
        low, high = (row.get(c) for c in interval_columns(key))
        if low is not None and high is not None:
            out[f"{key}_ci95"] = [low, high]
    for split in ("unseen", "seen"):  # the same over the families no search saw, and the ones it saw
        for key in ("pdr", "acc_worst"):
            name = f"{key}_{split}"
            if name in row:
                out[name] = row[name]
                low, high = (row.get(c) for c in interval_columns(name))
                if low is not None and high is not None:
                    out[f"{name}_ci95"] = [low, high]
        if f"acc_worst_family_{split}" in row:
            out[f"acc_worst_family_{split}"] = row[f"acc_worst_family_{split}"]
    if families:
        out.update({f"families_{split}": families.get(f"families_{split}") for split in ("unseen", "seen")})
    return clean(out)
