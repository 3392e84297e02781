"""`promptopt diagnose approx`: how far the paper's closed-form approximations are from exact δ_TCB.

On real positions: the statistical approximation ε / sqrt(dσ² ‖M G‖²_F) (App. F; `tcb_approx`) and its
V_eff limit ε sqrt(V_eff / (dσ²)) (`tcb_diffuse`) against the exact δ_TCB, as ratios approx / exact, per
V_eff band and overall: median and 10–90% range, geometric mean, the share within a factor of 2, and the
rank agreement (Spearman) with the exact value. The table also counts the positions where the paper's
expanded form S2 − 2 S3 + S2² (float64, gain ignored) departs from the conditioned one by more than 0.1%.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.analyses.diagnose.output import V_EFF_BANDS
from promptopt.metrics.stats import spearman


@dataclass
class ApproxResult:
    positions: pd.DataFrame  # per position: exact, approximations, ratios, the expanded form
    summary: pd.DataFrame  # per V_eff band and overall, one row per approximation


def approximation_gap(lm, frame: pd.DataFrame, *, eps: float = 1.0) -> ApproxResult:
    head = lm.output_head
    d_sigma2 = head.hidden_size * head.sigma2
    table = frame[
        ["source", "task", "item_id", "step", "token", "v_eff", "top_prob", "band", "tcb", "tcb_approx", "tcb_diffuse"]
    ].copy()
    s2, s3 = frame["s2"].to_numpy(dtype=float), frame["s3"].to_numpy(dtype=float)
    expanded = s2 - 2 * s3 + s2**2
    with np.errstate(divide="ignore", invalid="ignore"):
        table["tcb_approx_expanded"] = np.where(expanded > 0, eps / np.sqrt(d_sigma2 * expanded), np.inf)
        table["ratio_approx"] = table["tcb_approx"] / table["tcb"]
        table["ratio_diffuse"] = table["tcb_diffuse"] / table["tcb"]
        table["expanded_rel_error"] = np.abs(table["tcb_approx_expanded"] / table["tcb_approx"] - 1)
    return ApproxResult(table, summarize(table))


def summarize(table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for band in (*V_EFF_BANDS, "overall"):
        part = table if band == "overall" else table[table["band"] == band]
        ok = part[np.isfinite(part["tcb"]) & (part["tcb"] > 0)]
        for name in ("approx", "diffuse"):
            ratio = ok[f"ratio_{name}"].to_numpy(dtype=float)
            ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
            row = {"band": band, "approximation": "statistical" if name == "approx" else "V_eff limit", "n": len(ratio)}
            if len(ratio):
                row.update(
                    {
                        "median_ratio": float(np.median(ratio)),
                        "q10": float(np.quantile(ratio, 0.1)),
                        "q90": float(np.quantile(ratio, 0.9)),
                        "geomean_ratio": float(np.exp(np.log(ratio).mean())),
                        "within_2x": float(((ratio >= 0.5) & (ratio <= 2)).mean()),
                        "spearman_vs_exact": spearman(ok[f"tcb_{name}"], ok["tcb"]),
                    }
                )
            if name == "approx":
                row["expanded_off_gt_0.1pct"] = int((part["expanded_rel_error"] > 1e-3).sum())
            rows.append(row)
    return pd.DataFrame(rows)


def plot(result: ApproxResult, path) -> None:
    """Left: approximation vs exact δ_TCB (log–log, y = x). Right: ratio vs V_eff."""
    from promptopt.analyses.diagnose.output import new_figure, save_figure

    t = result.positions[np.isfinite(result.positions["tcb"])]
    fig, axes = new_figure(2, size=(11.0, 4.4))
    ax = axes[0][0]
    ax.scatter(t["tcb"], t["tcb_approx"], s=8, label="statistical approximation")
    ax.scatter(t["tcb"], t["tcb_diffuse"], s=8, marker="x", label="V_eff limit")
    lo = float(np.nanmin(t[["tcb", "tcb_approx", "tcb_diffuse"]].replace(np.inf, np.nan).to_numpy()))
    hi = float(np.nanmax(t[["tcb", "tcb_approx", "tcb_diffuse"]].replace(np.inf, np.nan).to_numpy()))
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("exact δ_TCB")
    ax.set_ylabel("approximation")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.scatter(t["v_eff"], t["ratio_approx"], s=8, label="statistical / exact")
    ax.scatter(t["v_eff"], t["ratio_diffuse"], s=8, marker="x", label="V_eff limit / exact")
    ax.axhline(1.0, color="grey", lw=0.8)
    for edge in (20, 100):
        ax.axvline(edge, color="grey", ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("V_eff")
    ax.set_ylabel("ratio")
    ax.legend(fontsize=8)
    save_figure(fig, path)
