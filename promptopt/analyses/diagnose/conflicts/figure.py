"""The conflicts figure: conflict classes per item, VCQ / AQ per question, Table 3's accuracies per set."""

from __future__ import annotations

import numpy as np
import pandas as pd

from promptopt.analyses.diagnose.conflicts.classes import CLASSES, ClassThresholds
from promptopt.analyses.diagnose.conflicts.question_sets import AQ_ACC_MEAN, VCQ_ACC_MEAN, SetThresholds

_COLOURS = {
    "accurate_but_unstable": "tab:orange",
    "inaccurate_but_stable": "tab:purple",
    "confident_but_unstable": "tab:red",
    "uncertain_but_stable": "tab:green",
}


def plot(
    items: pd.DataFrame, th: ClassThresholds, questions: pd.DataFrame, sets: SetThresholds, table3: pd.DataFrame, path
) -> None:
    """Left: log10 δ_TCB vs the confidence signal per item, coloured by class, thresholds drawn. Middle:
    VCQ / AQ — mean accuracy over seeds vs mean log10 δ_TCB per question. Right: Table 3's Acc and
    Acc_worst, baseline vs enhanced, per set (ours)."""
    from promptopt.analyses.diagnose.output import new_figure, save_figure

    fig, axes = new_figure(3, size=(15.0, 4.4))
    ax = axes[0][0]
    data = items[np.isfinite(items["log10_tcb"])]
    c = data[th.confidence]
    none = data["classes"] == ""
    ax.scatter(
        c[none & data["correct"].astype(bool)],
        data.loc[none & data["correct"].astype(bool), "log10_tcb"],
        s=14,
        facecolors="none",
        edgecolors="grey",
        label="no conflict (correct)",
    )
    ax.scatter(
        c[none & ~data["correct"].astype(bool)],
        data.loc[none & ~data["correct"].astype(bool), "log10_tcb"],
        s=14,
        marker="x",
        color="grey",
        label="no conflict (wrong)",
    )
    for name in CLASSES:  # later classes are drawn smaller on top, so an item in two shows both colours
        hit = data[name].astype(bool)
        size = 40 if name in CLASSES[:2] else 14
        ax.scatter(
            c[hit],
            data.loc[hit, "log10_tcb"],
            s=size,
            color=_COLOURS[name],
            label=f"{name.replace('_', ' ')} ({int(hit.sum())})",
        )
    ax.axhline(th.log_tcb_low, color="black", ls="--", lw=0.8)
    ax.axhline(th.log_tcb_high, color="black", ls="--", lw=0.8)
    ax.axvline(th.conf_low, color="black", ls=":", lw=0.8)
    ax.axvline(th.conf_high, color="black", ls=":", lw=0.8)
    if th.confidence == "v_eff":
        ax.set_xscale("log")
    ax.set_xlabel(th.confidence)
    ax.set_ylabel("log10 δ_TCB")
    ax.set_title(f"conflict classes ({len(items)} items)", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[0][1]
    q = questions[np.isfinite(questions["log_tcb_mean"])]
    for name, colour in (("neither", "grey"), ("AQ", "tab:red"), ("VCQ", "tab:blue")):
        for split, marker in (("dev", "o"), ("test", "^")):
            part = q[(q["set"] == name) & (q["split"] == split)] if "split" in q.columns else q[q["set"] == name]
            if len(part):
                ax.scatter(
                    part["log_tcb_mean"],
                    part["acc_mean"],
                    s=18,
                    marker=marker,
                    color=colour,
                    alpha=0.7,
                    label=f"{name} {split} ({len(part)})",
                )
    ax.axvline(sets.t_low, color="tab:red", ls="--", lw=0.8, label="T_L")
    ax.axvline(sets.t_high, color="tab:blue", ls="--", lw=0.8, label="T_H")
    ax.axhline(VCQ_ACC_MEAN, color="tab:blue", ls=":", lw=0.8)
    ax.axhline(AQ_ACC_MEAN, color="tab:red", ls=":", lw=0.8)
    ax.set_xlabel("mean log10 δ_TCB over seeds")
    ax.set_ylabel("mean accuracy over seeds")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("VCQ / AQ characterisation", fontsize=9)
    ax.legend(fontsize=6)
    ax = axes[0][2]
    ours = table3[table3["source"] == "ours"]
    labels = [f"{r.set}\n{r.prompt}\n(n={int(r.n)})" for r in ours.itertuples()]
    x = np.arange(len(ours))
    for offset, name in ((-0.2, "acc"), (0.2, "acc_worst")):
        values = ours[name].to_numpy(dtype=float)
        low = ours[f"{name}_ci_low"].to_numpy(dtype=float)
        high = ours[f"{name}_ci_high"].to_numpy(dtype=float)
        ax.bar(x + offset, values, width=0.4, label=name + " (95% CI)")
        yerr = np.nan_to_num(np.clip([values - low, high - values], 0, None))
        ax.errorbar(x + offset, values, yerr=yerr, fmt="none", color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 1.1)
    ax.set_title("held-out test items: baseline vs enhanced", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path)
