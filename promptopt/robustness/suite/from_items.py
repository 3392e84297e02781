"""A robustness summary recomputed from its answers alone (an ITEM_COLUMNS table): the numbers
`evaluate_robustness` gives, for answers that were not scored as one prompt — an ensemble's, whose clean and
perturbed answers are its members' combined (promptopt/experiments/ensemble.py)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from promptopt.metrics.stats import format_spread, robustness_intervals, robustness_metrics
from promptopt.robustness.suite.evaluate import SPLITS, split_summary
from promptopt.robustness.suite.spec import Suite


def _finite_mean(values) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(arr.mean()) if len(arr) else float("nan")


def robustness_from_items(items: pd.DataFrame, suite: Suite, seen: Collection[str] | None) -> dict:
    """The summary of `evaluate_robustness` from the answers: accuracy under every family, PDR, Acc_worst,
    AccVar with their item-bootstrap intervals, the seen/unseen splits and the first format family's spread."""
    clean_rows = items[items["family"].isna()]
    clean_correct = clean_rows.set_index("item_id")["clean_correct"].astype(bool)
    variant_rows = items[items["family"].notna()]
    variants_long = pd.DataFrame(
        {
            "item_id": variant_rows["item_id"].to_numpy(),
            "family": variant_rows["family"].to_numpy(),
            "correct": variant_rows["perturbed_correct"].astype(bool).to_numpy(),
        }
    )
    metrics = robustness_metrics(clean_correct, variants_long)
    intervals = robustness_intervals(clean_correct, variants_long, seed=suite.seed)
    acc_clean = metrics["acc_clean"]
    summary = {
        "suite": suite.name,
        "n_items": len(clean_correct),
        "acc_clean": acc_clean,
        "acc_perturbed_mean": float(np.nanmean(list(metrics["acc_by_family"].values())))
        if metrics["acc_by_family"]
        else float("nan"),
        "acc_var_pert": metrics["acc_var"],
        "acc_var_pert_ci95": intervals["acc_var_ci95"],
        "acc_var_families": metrics["acc_var_families"],
        "acc_worst": metrics["acc_worst"],
        "acc_worst_ci95": intervals["acc_worst_ci95"],
        "acc_worst_family_min": metrics["acc_worst_family_min"],
        "acc_worst_family": metrics["acc_worst_family"],
        "pdr": metrics["pdr"],
        "pdr_ci95": intervals["pdr_ci95"],
        "pdr_pooled": metrics["pdr_pooled"],
        "pdr_pooled_ci95": intervals["pdr_pooled_ci95"],
        "pdr_note": "undefined: clean accuracy is 0" if acc_clean == 0 else "",
        "tcb_clean_mean": _finite_mean(clean_rows["clean_tcb"]),
        "tcb_perturbed_mean": _finite_mean(variant_rows["perturbed_tcb"]),
    }
    spreads = {}
    for family in suite.families:
        if family.operator != "format":
            continue
        rows = variant_rows[variant_rows["family"] == family.name]
        if not len(rows):
            continue
        columns = [clean_correct.astype(float)] + [
            group.set_index("item_id")["perturbed_correct"].astype(float) for _, group in rows.groupby("variant")
        ]
        matrix = pd.concat(columns, axis=1).reindex(clean_correct.index)
        spreads[family.name] = format_spread(matrix.to_numpy(), seed=suite.seed)
    if spreads:
        name, first = next(iter(spreads.items()))
        summary.update(
            format_spread=first["spread"],
            format_spread_ci95=first["ci95"],
            format_spread_n_formats=first["n_formats"],
            format_spread_family=name,
        )
        if seen is not None:
            for split in SPLITS:
                names = [n for n in spreads if (n in seen) == (split == "seen")]
                part = spreads[names[0]] if names else {"spread": float("nan"), "ci95": [float("nan"), float("nan")]}
                summary.update(
                    {
                        f"format_spread_{split}": part["spread"],
                        f"format_spread_{split}_ci95": part["ci95"],
                        f"format_spread_{split}_family": names[0] if names else None,
                    }
                )
    if seen is not None:
        summary.update(
            split_summary(clean_correct, variants_long, [f.name for f in suite.families], seen, seed=suite.seed)
        )
    return summary


__all__ = ["robustness_from_items"]
