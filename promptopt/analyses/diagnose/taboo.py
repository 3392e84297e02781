"""`promptopt diagnose taboo`: the Taboo paper's dose, ablation and sampling analyses on one task.

- Dose: mean injected surprisal per intervention ΔS̄ (bits) at each taboo rank i (word-initial, greedy),
  with the least-squares fit ΔS̄ ≈ a + b·ln i and its R² (App. D: "grows roughly logarithmically").
- Ablation: word-initial vs mid-word masking at matched ranks (§2.2: mid-word collapses accuracy). The
  mid-word trigger is `mid_word_masks`' "continues a word", never EOS, newlines, digits or punctuation.
- Sampling: temperature τ runs over several seeds — baseline and taboo both sampled, seed by seed — with the
  seed-to-seed SD of accuracy and retention (Limitations: "three seeds each, SD ≤ 0.04"). Like the paper,
  the prompt is fixed and only the generated continuation is sampled (top-p = 1, no top-k); the taboo
  trigger and ΔS read the unscaled logits, and the intervened step samples from what the mask leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt import progress as steps
from promptopt.metrics.stats import fit_log
from promptopt.robustness import taboo_stress

SUMMARY_COLUMNS = [
    "rank",
    "n",
    "accuracy",
    "retention",
    "retention_ci_low",
    "retention_ci_high",
    "marginal_retention",
    "mean_surprisal_per_intervention",
    "surprisal_total_per_item",
    "interventions_per_item",
    "length_expansion",
]


@dataclass
class TabooSweep:
    dose: pd.DataFrame  # greedy word-initial, one row per rank (0 = baseline)
    fit: dict  # a, b, r2, n of ΔS̄ ≈ a + b·ln i over the ranks
    ablation: pd.DataFrame  # word-initial vs mid-word at matched ranks
    sampled: pd.DataFrame  # one row per (seed, rank) at temperature τ
    sampled_summary: pd.DataFrame  # per rank: mean and SD over seeds
    items: pd.DataFrame  # every item of every run, with run labels


def taboo_sweep(
    scorer,
    prompt,
    items,
    *,
    ranks=(1, 2, 4, 8),
    mid_word_ranks=(2,),
    temperature: float = 0.7,
    seeds=(0, 1, 2),
    sampled_ranks=(1,),
) -> TabooSweep:
    frames = []
    steps.step(f"greedy dose sweep: baseline and ranks {list(ranks)} on {len(items)} items")
    greedy = taboo_stress(scorer, prompt, items, ranks=tuple(ranks))
    frames.append(greedy.items.assign(run="greedy", mode="word_initial", seed=-1))
    dose = greedy.summary[SUMMARY_COLUMNS].copy()
    taboo_rows = dose[dose["rank"] > 0]
    fit = fit_log(taboo_rows["rank"], taboo_rows["mean_surprisal_per_intervention"])

    ablation = pd.DataFrame()
    if mid_word_ranks:
        steps.step(f"mid-word ablation at ranks {list(mid_word_ranks)}")
        mid = taboo_stress(scorer, prompt, items, ranks=tuple(mid_word_ranks), mode="mid_word")
        frames.append(mid.items.assign(run="greedy", mode="mid_word", seed=-1))
        initial = greedy.summary.set_index("rank")
        if not set(mid_word_ranks) <= set(initial.index):  # matched ranks the dose sweep did not run
            extra = taboo_stress(
                scorer, prompt, items, ranks=tuple(r for r in mid_word_ranks if r not in initial.index)
            )
            initial = pd.concat([initial, extra.summary.set_index("rank").drop(index=0)])
        rows = []
        for _, m in mid.summary[mid.summary["rank"] > 0].iterrows():
            w = initial.loc[m["rank"]]
            for mode, r in (("word_initial", w), ("mid_word", m)):
                rows.append({"rank": int(m["rank"]), "mode": mode, **{c: r[c] for c in SUMMARY_COLUMNS if c != "rank"}})
        ablation = pd.DataFrame(rows)

    sampled_rows = []
    if temperature > 0 and seeds:
        for seed in steps.iterate(list(seeds), f"sampled runs (τ = {temperature:g})"):
            run = taboo_stress(
                scorer, prompt, items, ranks=tuple(sampled_ranks), temperature=temperature, seed=int(seed)
            )
            frames.append(run.items.assign(run=f"t={temperature:g}", mode="word_initial", seed=int(seed)))
            for _, r in run.summary.iterrows():
                sampled_rows.append(
                    {"seed": int(seed), "temperature": temperature, **{c: r[c] for c in SUMMARY_COLUMNS}}
                )
    sampled = pd.DataFrame(sampled_rows)
    return TabooSweep(dose, fit, ablation, sampled, _seed_summary(sampled), pd.concat(frames, ignore_index=True))


def _seed_summary(sampled: pd.DataFrame) -> pd.DataFrame:
    if sampled.empty:
        return pd.DataFrame()
    rows = []
    for rank, part in sampled.groupby("rank"):
        row = {"rank": int(rank), "seeds": len(part)}
        for name in ("accuracy", "retention", "marginal_retention", "mean_surprisal_per_intervention"):
            values = part[name].to_numpy(dtype=float)
            row[f"{name}_mean"] = float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")
            row[f"{name}_sd"] = float(np.nanstd(values, ddof=1)) if np.isfinite(values).sum() > 1 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def plot(sweep: TabooSweep, path) -> None:
    """ΔS̄ vs rank with the log fit; retention vs rank (Wilson 95%); word-initial vs mid-word accuracy."""
    from promptopt.analyses.diagnose.output import new_figure, save_figure

    fig, axes = new_figure(3, size=(14.0, 4.2))
    d = sweep.dose[sweep.dose["rank"] > 0]
    ax = axes[0][0]
    ax.plot(d["rank"], d["mean_surprisal_per_intervention"], "o", label="measured")
    if np.isfinite(sweep.fit["b"]):
        grid = np.linspace(d["rank"].min(), d["rank"].max(), 50)
        ax.plot(
            grid,
            sweep.fit["a"] + sweep.fit["b"] * np.log(grid),
            "-",
            label=f"{sweep.fit['a']:.2f} + {sweep.fit['b']:.2f}·ln i (R² = {sweep.fit['r2']:.2f})",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("taboo rank i")
    ax.set_ylabel("mean ΔS per intervention (bits)")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ret = d["retention"].to_numpy(dtype=float)
    yerr = np.clip(
        [ret - d["retention_ci_low"].to_numpy(dtype=float), d["retention_ci_high"].to_numpy(dtype=float) - ret], 0, None
    )
    ax.errorbar(d["rank"], ret, yerr=yerr, fmt="o-", capsize=3, label="greedy: conditional retention (Wilson 95%)")
    if not sweep.sampled_summary.empty:
        s = sweep.sampled_summary
        ax.errorbar(
            s["rank"],
            s["marginal_retention_mean"],
            yerr=s["marginal_retention_sd"],
            fmt="s",
            capsize=3,
            label="sampled: marginal retention (mean ± seed SD)",
        )
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.05, 1.3)
    ax.set_xlabel("taboo rank i")
    ax.set_ylabel("retention")
    ax.legend(fontsize=8)
    ax = axes[0][2]
    if not sweep.ablation.empty:
        a = sweep.ablation.pivot(index="rank", columns="mode", values="accuracy")
        x = np.arange(len(a))
        base = float(sweep.dose.loc[sweep.dose["rank"] == 0, "accuracy"].iloc[0])
        for offset, mode in ((-0.2, "word_initial"), (0.2, "mid_word")):
            ax.bar(x + offset, a[mode], width=0.4, label=mode.replace("_", "-"))
        ax.axhline(base, color="grey", ls="--", lw=0.8, label="no taboo")
        ax.set_xticks(x)
        ax.set_xticklabels([f"i = {r}" for r in a.index])
        ax.set_ylabel("accuracy")
        ax.legend(fontsize=8)
    save_figure(fig, path)
