"""`promptopt diagnose regimes`: the δ_TCB paper's Table 1 on real positions.

Pearson (the paper's statistic) and Spearman correlations of (δ_TCB, V_eff), (δ_TCB, margin) and
(margin, V_eff), each with n and a 95% Fisher-z interval (Bonett–Wright standard error for Spearman),
over the whole diverse position set, over its low-V_eff subset (the paper's LVD are high-confidence
states; here: V_eff below a threshold, default 2) and over the rest (V_eff at or above it): δ_TCB is
U-shaped in V_eff — it falls as a peaked distribution spreads, then grows like sqrt(V_eff) in the diffuse
regime — so a set with many peaked states can show no overall correlation while each regime shows the
paper's. Positions where δ_TCB is +inf (o a point mass in
float64) are left out and counted. Pearson on raw δ_TCB is dominated by its heavy right tail, so the
table also gives Pearson on log10 δ_TCB and log10 V_eff (margin stays linear: it is already a log-ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt.metrics.stats import correlation_interval, pearson, pearson_interval, spearman

PAIRS = (("tcb", "v_eff"), ("tcb", "margin"), ("margin", "v_eff"))
PAPER_TABLE1 = {  # DPD (N = 309) and LVD (N = 360), Llama-3.1-8B, MMLU zero-shot
    "all": {("tcb", "v_eff"): 0.95, ("tcb", "margin"): -0.40, ("margin", "v_eff"): -0.41},
    "low_v_eff": {("tcb", "v_eff"): 0.08, ("tcb", "margin"): 0.62, ("margin", "v_eff"): -0.60},
}
PAPER_TABLE1["high_v_eff"] = PAPER_TABLE1["all"]  # the paper's DPD is its broad (diffuse) regime
_LOG = {"tcb", "v_eff"}


@dataclass
class RegimesResult:
    table: pd.DataFrame  # one row per (subset, pair)
    n_infinite: int  # positions left out because δ_TCB = +inf
    low_v_eff: float


def regime_correlations(frame: pd.DataFrame, *, low_v_eff: float = 2.0) -> RegimesResult:
    finite = np.isfinite(frame["tcb"].to_numpy(dtype=float))
    data = frame[finite]
    rows = []
    low = data["v_eff"] < low_v_eff
    for subset, part in (("all", data), ("low_v_eff", data[low]), ("high_v_eff", data[~low])):
        for x_name, y_name in PAIRS:
            x, y = part[x_name].to_numpy(dtype=float), part[y_name].to_numpy(dtype=float)
            n = len(x)
            r, rho = pearson(x, y), spearman(x, y)
            lx = np.log10(x) if x_name in _LOG else x
            ly = np.log10(y) if y_name in _LOG else y
            r_log = pearson(lx, ly)
            r_ci, r_log_ci = pearson_interval(x, y), pearson_interval(lx, ly)
            rows.append(
                {
                    "subset": subset,
                    "pair": f"{x_name}~{y_name}",
                    "n": n,
                    "pearson": r,
                    "pearson_ci_low": r_ci[0],
                    "pearson_ci_high": r_ci[1],
                    "spearman": rho,
                    "spearman_ci_low": correlation_interval(rho, n, method="spearman")[0],
                    "spearman_ci_high": correlation_interval(rho, n, method="spearman")[1],
                    "pearson_log": r_log,
                    "pearson_log_ci_low": r_log_ci[0],
                    "pearson_log_ci_high": r_log_ci[1],
                    "paper_pearson": PAPER_TABLE1[subset][(x_name, y_name)],
                }
            )
    return RegimesResult(pd.DataFrame(rows), int((~finite).sum()), low_v_eff)


def plot(frame: pd.DataFrame, result: RegimesResult, path) -> None:
    """The three pairs as scatter plots (log axes for δ_TCB and V_eff), the low-V_eff subset highlighted."""
    from promptopt.analyses.diagnose.output import new_figure, save_figure

    data = frame[np.isfinite(frame["tcb"].to_numpy(dtype=float))]
    low = data["v_eff"] < result.low_v_eff
    fig, axes = new_figure(3, size=(14.0, 4.2))
    for ax, (x_name, y_name) in zip(axes[0], PAIRS):
        ax.scatter(data.loc[~low, x_name], data.loc[~low, y_name], s=8, label=f"V_eff ≥ {result.low_v_eff:g}")
        ax.scatter(
            data.loc[low, x_name], data.loc[low, y_name], s=8, color="tab:red", label=f"V_eff < {result.low_v_eff:g}"
        )
        if x_name in _LOG:
            ax.set_xscale("log")
        if y_name in _LOG:
            ax.set_yscale("log")
        rows = result.table[result.table["pair"] == f"{x_name}~{y_name}"].set_index("subset")
        ax.set_title(
            f"Pearson r: all {rows.loc['all', 'pearson']:+.2f}, low {rows.loc['low_v_eff', 'pearson']:+.2f}, "
            f"rest {rows.loc['high_v_eff', 'pearson']:+.2f}\n"
            f"paper: DPD {rows.loc['all', 'paper_pearson']:+.2f}, LVD {rows.loc['low_v_eff', 'paper_pearson']:+.2f}",
            fontsize=9,
        )
        ax.set_xlabel(x_name)
        ax.set_ylabel(y_name)
        ax.legend(fontsize=7)
    save_figure(fig, path)
