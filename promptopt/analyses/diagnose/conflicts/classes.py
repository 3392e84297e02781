"""Conflict classes (δ_TCB paper §4.3, D.1), per scored item, with x = log10 δ_TCB and thresholds L < H on it:
- accurate but unstable:   correct      and x < L
- inaccurate but stable:   wrong        and x > H
- confident but unstable:  confident    and x < L
- uncertain but stable:    uncertain    and x > H
Confident / uncertain read one confidence signal c with thresholds C_L ≤ C_H: P(top1) (`top_prob`, the
default) or the logit margin z_k − z_j*: confident c > C_H, uncertain c < C_L; V_eff (higher = flatter):
confident V_eff < C_L, uncertain V_eff > C_H. By default L, H, C_L, C_H are the 25th and 75th percentiles
over the scored items (δ_TCB's scale differs by model, so no absolute value carries over); each can be
given instead. The classes are not exclusive (a correct, confident, low-δ item is in the first and third).
Shares carry 95% Wilson intervals over items, of all items and of their group (correct, wrong, confident,
uncertain). Items with δ_TCB = +inf (o a point mass) have x = +inf: stable; quantiles use finite values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.errors import UserError
from promptopt.metrics.stats import wilson_interval

CLASSES = ("accurate_but_unstable", "inaccurate_but_stable", "confident_but_unstable", "uncertain_but_stable")
CONFIDENCE_SIGNALS = ("top_prob", "margin", "v_eff")  # v_eff: higher means less confident


def log10_tcb(tcb) -> np.ndarray:
    """log10 δ_TCB (+inf stays +inf)."""
    with np.errstate(divide="ignore"):
        return np.log10(np.asarray(tcb, dtype=float))


def finite_quantile(values, q: float) -> float:
    """The q-quantile of the finite values (NaN when none is finite)."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    return float(np.quantile(finite, q)) if len(finite) else float("nan")


@dataclass(frozen=True)
class ClassThresholds:
    log_tcb_low: float  # L on log10 δ_TCB
    log_tcb_high: float  # H
    confidence: str  # top_prob, margin or v_eff
    conf_low: float  # C_L, in the signal's own units
    conf_high: float  # C_H
    how: dict  # threshold name -> how it was set, in words

    def table(self) -> pd.DataFrame:
        rows = [
            ("log_tcb_low", "log_tcb_low", self.log_tcb_low),
            ("log_tcb_high", "log_tcb_high", self.log_tcb_high),
            (f"{self.confidence}_low", "conf_low", self.conf_low),
            (f"{self.confidence}_high", "conf_high", self.conf_high),
        ]
        return pd.DataFrame(
            [
                {
                    "threshold": label,
                    "value": value,
                    "tcb": 10.0**value if key.startswith("log_tcb") else float("nan"),
                    "how": self.how[key],
                }
                for label, key, value in rows
            ]
        )


def class_thresholds(
    frame: pd.DataFrame,
    *,
    confidence: str = "top_prob",
    low_q: float = 0.25,
    high_q: float = 0.75,
    log_tcb_low: float | None = None,
    log_tcb_high: float | None = None,
    conf_low: float | None = None,
    conf_high: float | None = None,
) -> ClassThresholds:
    """L, H on log10 δ_TCB and C_L, C_H on the confidence signal: given, or the low_q / high_q quantiles of
    the items' values (finite values only)."""
    if confidence not in CONFIDENCE_SIGNALS:
        raise UserError(f"--confidence {confidence}: expected one of {', '.join(CONFIDENCE_SIGNALS)}")
    if confidence not in frame.columns:
        raise UserError(f"the scored items have no '{confidence}' column; use --confidence margin or v_eff")
    if not 0 <= low_q <= high_q <= 1:
        raise UserError(f"quantiles: expected 0 ≤ low ≤ high ≤ 1, got {low_q}, {high_q}")
    x, c = log10_tcb(frame["tcb"]), frame[confidence].to_numpy(dtype=float)
    how, values = {}, {}
    for name, given, data, q, what in (
        ("log_tcb_low", log_tcb_low, x, low_q, "log10 δ_TCB"),
        ("log_tcb_high", log_tcb_high, x, high_q, "log10 δ_TCB"),
        ("conf_low", conf_low, c, low_q, confidence),
        ("conf_high", conf_high, c, high_q, confidence),
    ):
        if given is None:
            values[name] = finite_quantile(data, q)
            how[name] = f"q{100 * q:g} of {what} over {int(np.isfinite(data).sum())} items"
        else:
            values[name] = float(given)
            how[name] = "given"
    if values["log_tcb_low"] > values["log_tcb_high"]:
        raise UserError(
            f"δ_TCB thresholds: low {values['log_tcb_low']:.4g} is above high {values['log_tcb_high']:.4g} (log10 δ_TCB)"
        )
    if values["conf_low"] > values["conf_high"]:
        raise UserError(
            f"{confidence} thresholds: low {values['conf_low']:.4g} is above high {values['conf_high']:.4g}"
        )
    return ClassThresholds(
        values["log_tcb_low"], values["log_tcb_high"], confidence, values["conf_low"], values["conf_high"], how
    )


def classify_items(frame: pd.DataFrame, th: ClassThresholds) -> pd.DataFrame:
    """The item table with log10_tcb, unstable / stable / confident / uncertain, one boolean column per
    class and `classes` (the names of the classes an item is in, joined by '+'; '' for none)."""
    out = frame.copy()
    out["log10_tcb"] = log10_tcb(out["tcb"])
    correct = out["correct"].astype(bool).to_numpy()
    x = out["log10_tcb"].to_numpy()
    c = out[th.confidence].to_numpy(dtype=float)
    out["unstable"] = x < th.log_tcb_low
    out["stable"] = x > th.log_tcb_high
    if th.confidence == "v_eff":  # a flatter distribution is the less confident one
        out["confident"], out["uncertain"] = c < th.conf_low, c > th.conf_high
    else:
        out["confident"], out["uncertain"] = c > th.conf_high, c < th.conf_low
    out["accurate_but_unstable"] = correct & out["unstable"]
    out["inaccurate_but_stable"] = ~correct & out["stable"]
    out["confident_but_unstable"] = out["confident"] & out["unstable"]
    out["uncertain_but_stable"] = out["uncertain"] & out["stable"]
    out["classes"] = ["+".join(name for name in CLASSES if row[name]) for _, row in out[list(CLASSES)].iterrows()]
    return out


_GROUPS = {
    "accurate_but_unstable": ("correct", "correct & log δ < L"),
    "inaccurate_but_stable": ("wrong", "wrong & log δ > H"),
    "confident_but_unstable": ("confident", "confident & log δ < L"),
    "uncertain_but_stable": ("uncertain", "uncertain & log δ > H"),
}


def class_summary(items: pd.DataFrame) -> pd.DataFrame:
    """Per class: count, share of all items and share of its group (correct, wrong, confident, uncertain),
    each with a 95% Wilson interval."""
    n = len(items)
    groups = {
        "correct": items["correct"].astype(bool),
        "wrong": ~items["correct"].astype(bool),
        "confident": items["confident"],
        "uncertain": items["uncertain"],
    }
    rows = []
    for name in CLASSES:
        group, rule = _GROUPS[name]
        count = int(items[name].sum())
        n_group = int(groups[group].sum())
        low, high = wilson_interval(count, n)
        g_low, g_high = wilson_interval(count, n_group)
        rows.append(
            {
                "class": name,
                "rule": rule,
                "n_items": n,
                "count": count,
                "share": count / n if n else float("nan"),
                "ci_low": low,
                "ci_high": high,
                "group": group,
                "n_group": n_group,
                "share_of_group": count / n_group if n_group else float("nan"),
                "group_ci_low": g_low,
                "group_ci_high": g_high,
            }
        )
    return pd.DataFrame(rows)
