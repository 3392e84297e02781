"""The compare's tables: one row per evaluated candidate (`run_record`, a RunRow: test accuracy with its Wilson interval,
δ_TCB (median and geometric mean, shown; the mean is kept in the files but a decision rule such as pmi can give
one item a δ_TCB of 1e8 and make it the whole mean), PPL and every robustness number over all judged families, the unseen ones and the seen ones), and one
row per strategy (`strategy_table`: its winners' numbers, mean ± sd over seeds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from promptopt.metrics.stats import wilson_interval
from promptopt.workflows.compare.evaluate import Evaluated
from promptopt.workflows.compare.paired import PAIRED_KEYS, SPLITS, pooled_acc_worst_intervals
from promptopt.workflows.compare.records import (
    ACCURACY,
    ACCURACY_CI,
    PPL_MEAN,
    SEARCH_SECONDS,
    SELECTED_BY,
    TCB_GEOMEAN,
    TCB_MEAN,
    TCB_MEDIAN,
    RunRow,
    interval_columns,
    sd_column,
)

# per prompt: over all judged families, then (suffix _unseen / _seen) over each split alone
_ROBUST_KEYS = ("acc_var_pert", "pdr", "pdr_pooled", "acc_worst", "acc_worst_family_min", "acc_worst_family")
_SPLIT_MEANS = ("acc_var_pert", "pdr", "pdr_pooled", "acc_worst", "acc_worst_family_min")


def run_row(strategy, seed, rank, ev: Evaluated, *, winner, how, extra) -> dict:
    """`run_record`'s row as the columns compare writes (`extra`: RunRow's source fields by name)."""
    return run_record(strategy, seed, rank, ev, winner=winner, how=how, **extra).columns()


def run_record(strategy, seed, rank, ev: Evaluated, *, winner, how, **source) -> RunRow:
    """An evaluated candidate's row of compare_runs.csv; `source`: where it came from (RunRow's trial, dev_accuracy,
    dev_correct, dev_signed_stability, cost, card, members)."""
    t = ev.test
    n, k = len(t), int(t["correct"].sum())
    tcb = t["tcb"].replace([np.inf], np.nan)  # as `summarize`: finite values (a point mass is infinite)
    r = ev.robust
    robustness = {}
    for key in (
        "acc_var_pert",
        "acc_var_families",
        "pdr",
        "pdr_pooled",
        "acc_worst",
        "acc_worst_family_min",
        "acc_worst_family",
        "tcb_perturbed_mean",
        "taboo_retention_i1",
    ):
        robustness[key] = r.get(key, math.nan)
    for key in ("acc_worst", "pdr", "acc_var_pert"):
        low, high = interval_columns(key)
        robustness[low], robustness[high] = r.get(f"{key}_ci95", [math.nan, math.nan])
    for split in SPLITS:  # the same numbers over the unseen families alone, and over the seen ones
        for key in _ROBUST_KEYS:
            value = r.get(f"{key}_{split}")
            robustness[f"{key}_{split}"] = math.nan if value is None else value
        for key in PAIRED_KEYS:
            low, high = interval_columns(f"{key}_{split}")
            robustness[low], robustness[high] = r.get(f"{key}_{split}_ci95") or [math.nan, math.nan]
    return RunRow(
        strategy=strategy,
        seed=seed,
        rank=rank,
        winner=winner,
        n_test=n,
        accuracy=k / n,
        accuracy_ci=tuple(wilson_interval(k, n)),
        tcb_mean=float(tcb.mean()),
        tcb_geomean=float(np.exp(np.log(tcb.dropna()).mean())),
        tcb_median=float(tcb.median()),
        ppl_mean=float(t["ppl"].mean()),
        selected_by=how,
        robustness=robustness,
        **source,
    )


def mean_sd(values: pd.Series) -> tuple[float, float]:
    """Mean and sd across seeds (NaN sd for one value). Equal values are that value with sd exactly 0: summing
    them leaves float residue (three seeds at 0.8 give a mean of 0.8000000000000002 and an sd of 1.36e-16)."""
    if len(values) > 1 and values.notna().all() and values.nunique() == 1:
        return float(values.iloc[0]), 0.0
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def strategy_table(runs: pd.DataFrame, winners: dict, walls: dict, *, seed: int = 0) -> pd.DataFrame:
    """Per strategy: the winners' numbers, mean over seeds (± sd across seeds when there are several), with
    intervals: one search's own, or over several the pooled ones (`pooled_acc_worst_intervals`)."""
    rows = []
    chosen = runs[runs["winner"]]
    for name, group in chosen.groupby("strategy", sort=False):
        row = {
            "strategy": name,
            "n_seeds": len(winners[name]) if name != "baseline" else 1,
            "n_test": int(group["n_test"].iloc[0]),
        }
        for key in (
            ACCURACY,
            TCB_MEAN,
            TCB_GEOMEAN,
            TCB_MEDIAN,
            PPL_MEAN,
            "acc_var_pert",
            "pdr",
            "pdr_pooled",
            "acc_worst",
            "acc_worst_family_min",
            "taboo_retention_i1",
            *(f"{k}_{split}" for split in SPLITS for k in _SPLIT_MEANS),
        ):
            row[key], row[sd_column(key)] = mean_sd(group[key].astype(float))
        if len(group) == 1:  # one search: its own intervals
            for key in (
                *ACCURACY_CI,
                *interval_columns("acc_worst"),
                *interval_columns("pdr"),
                *(column for split in SPLITS for k in PAIRED_KEYS for column in interval_columns(f"{k}_{split}")),
            ):
                row[key] = group[key].iloc[0]
        else:  # several: the pooled Wilson interval of accuracy over seeds × items
            k = float((group[ACCURACY] * group["n_test"]).sum())
            row[ACCURACY_CI[0]], row[ACCURACY_CI[1]] = wilson_interval(round(k), int(group["n_test"].sum()))
            row.update(pooled_acc_worst_intervals(winners[name], seed=seed))
        for key in ("acc_worst_family", *(f"acc_worst_family_{split}" for split in SPLITS)):
            row[key] = group[key].iloc[0]
        row[SELECTED_BY] = group[SELECTED_BY].iloc[0]
        row[SEARCH_SECONDS] = walls.get(name, math.nan)  # its searches' wall time (NaN: baseline, ensembles)
        rows.append(row)
    return pd.DataFrame(rows)
