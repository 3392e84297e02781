"""Strategies paired on the same items, and the seeds of one search pooled: Δ accuracy with an exact paired p-value
clustered by item (McNemar's with one seed, a sign-flip test on per-item differences with several), Δ Acc_worst and Δ PDR, each with a 95% bootstrap interval that resamples items with all their seeds
(`cluster_resamples`), so repeating a search does not narrow an interval by itself."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pandas as pd

from promptopt.metrics.stats import PerItemRobustness, bootstrap_resamples, percentile_interval
from promptopt.metrics.stats.binomial import clustered_paired_exact, paired_test_name
from promptopt.workflows.compare.evaluate import Evaluated
from promptopt.workflows.compare.records import DELTA_ACCURACY, interval_columns

SPLITS = ("unseen", "seen")
PAIRED_KEYS = ("acc_worst", "pdr")  # the robustness numbers paired (and given pooled intervals), per split too
_N_BOOT = 2000


def pooled_acc_worst_intervals(evaluations: list[Evaluated], *, seed: int) -> dict:
    """Acc_worst's 95% interval over several seeds' winners (over all judged families, and over the unseen and
    the seen ones), as the paired table resamples: items, each with all its seeds. The mean over seeds of
    per-seed Acc_worst is the pooled Acc_worst (every seed judges the same items), so the interval is around
    the table's value. PDR keeps its sd across seeds only: a mean of per-seed PDRs is no pooled statistic."""
    if evaluations[0].clean is None:
        return {}
    out, n_seeds = {}, len(evaluations)
    labelled = all("seen" in ev.variants for ev in evaluations)
    for split in (None, *(SPLITS if labelled else ())):
        if split and not _has_families(evaluations, split):
            continue
        pooled = _pooled(evaluations, split)
        n_items = len(pooled.items) // n_seeds
        name = f"acc_worst_{split}" if split else "acc_worst"
        resamples = cluster_resamples(n_items, n_seeds, n_boot=_N_BOOT // 4, seed=seed)
        out[interval_columns(name)[0]], out[interval_columns(name)[1]] = (
            percentile_interval(pooled.resampled_metrics(resamples)["acc_worst"]) if n_items else (math.nan, math.nan)
        )
    return out


def paired_table(winners: dict, *, seed: int) -> pd.DataFrame:
    """Every pair of strategies on the same test items: Δ accuracy, Δ Acc_worst, Δ PDR (first − second); the
    robustness deltas over all judged families, and where families are labelled over the unseen ones alone
    (`delta_acc_worst_unseen`: the headline) and the seen ones alone (NaN when the split has no family).

    With several seeds the pairs are (seed, item), but the seeds of one item are not independent samples: the
    bootstrap resamples items, each with all its seeds (`cluster_resamples`), so repeating a search does not narrow
    an interval by itself. The exact test is clustered the same way (`clustered_paired_exact`: items are the unit,
    each with the sum of its seeds' differences; McNemar's with one seed); `paired_test` names it, and `mcnemar_p`
    (its name kept for the files already written) holds its p. A difference is starred only when that p < 0.05 and
    the clustered interval excludes 0."""
    rows = []
    for a, b in combinations(list(winners), 2):
        row = {"a": a, "b": b}
        acc_a = np.concatenate([ev.test["correct"].to_numpy(dtype=bool) for ev in winners[a]])
        acc_b = np.concatenate([ev.test["correct"].to_numpy(dtype=bool) for ev in winners[b]])
        n_seeds = len(winners[a])
        n_items = len(acc_a) // n_seeds
        row["n_pairs"] = len(acc_a)
        row[DELTA_ACCURACY] = float(acc_a.mean() - acc_b.mean())
        resamples = cluster_resamples(n_items, n_seeds, n_boot=_N_BOOT, seed=seed)
        delta_ci = interval_columns(DELTA_ACCURACY)
        row[delta_ci[0]], row[delta_ci[1]] = (
            percentile_interval(acc_a[resamples].mean(-1) - acc_b[resamples].mean(-1))
            if n_items
            else (math.nan, math.nan)
        )
        row["only_a_correct"], row["only_b_correct"], row["mcnemar_p"] = clustered_paired_exact(
            acc_a.reshape(n_seeds, n_items), acc_b.reshape(n_seeds, n_items)
        )
        row["paired_test"] = paired_test_name(n_seeds)
        if winners[a][0].clean is not None:
            labelled = all("seen" in ev.variants for ev in (*winners[a], *winners[b]))
            for split in (None, *(SPLITS if labelled else ())):
                suffix = f"_{split}" if split else ""
                if split and not _has_families(winners[a], split):
                    for key in PAIRED_KEYS:
                        name = f"delta_{key}{suffix}"
                        low, high = interval_columns(name)
                        row[name] = row[low] = row[high] = math.nan
                    continue
                pa, pb = _pooled(winners[a], split), _pooled(winners[b], split)
                n_robust = len(pa.items) // n_seeds
                whole_a, whole_b = pa.metrics(), pb.metrics()
                resamples = cluster_resamples(n_robust, n_seeds, n_boot=_N_BOOT // 4, seed=seed)
                each_a, each_b = (
                    pa.resampled_metrics(resamples),
                    pb.resampled_metrics(resamples),
                )  # on the same resamples
                for key in PAIRED_KEYS:
                    name = f"delta_{key}{suffix}"
                    row[name] = float(whole_a[key] - whole_b[key])
                    low, high = interval_columns(name)
                    row[low], row[high] = (
                        percentile_interval(each_a[key] - each_b[key]) if n_robust else (math.nan, math.nan)
                    )
        row["significant"] = bool(row["mcnemar_p"] < 0.05 and not (row[delta_ci[0]] <= 0 <= row[delta_ci[1]]))
        rows.append(row)
    return pd.DataFrame(rows)


def cluster_resamples(n_items: int, n_seeds: int, *, n_boot: int, seed: int) -> np.ndarray:
    """The bootstrap's resamples of items (`bootstrap_resamples`) as positions in a seed-major pooled vector (seed 0's
    items, then seed 1's, ...), (n_boot, n_seeds · n_items): every seed of each resampled item, so resampling items
    keeps an item's seeds together."""
    items = bootstrap_resamples(n_items, n_boot=n_boot, seed=seed)
    return (np.arange(n_seeds)[None, :, None] * n_items + items[:, None, :]).reshape(n_boot, n_seeds * n_items)


def _pooled(evaluations: list[Evaluated], split: str | None = None) -> PerItemRobustness:
    """Items of every seed, keyed (seed, item), so two strategies' seeds pair up item by item; with `split`, only the
    variants of its families (every item stays: one no family of the split perturbed counts as its clean answer).
    `cluster_resamples` reads the result seed-major, so every seed must have judged the same items in the same order."""
    first = list(evaluations[0].clean.index)
    if any(list(ev.clean.index) != first for ev in evaluations[1:]):
        raise ValueError("the seeds' winners were stressed on different robustness items: their answers do not pool")
    clean = pd.concat([ev.clean.rename(lambda i, s=s: f"{s}:{i}") for s, ev in enumerate(evaluations)])
    variants = pd.concat(
        [
            ev.variants.assign(item_id=ev.variants["item_id"].map(lambda i, s=s: f"{s}:{i}"))
            for s, ev in enumerate(evaluations)
        ],
        ignore_index=True,
    )
    if split is not None:
        variants = variants[variants["seen"].astype(bool) == (split == "seen")]
    return PerItemRobustness(clean, variants[["item_id", "family", "correct"]])


def _has_families(evaluations: list[Evaluated], split: str) -> bool:
    """Whether the judging suite has a family of this split (the summary lists them even when no variant was kept)."""
    return bool(evaluations[0].robust.get(f"families_{split}", [None]))
