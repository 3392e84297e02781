"""A robustness summary recomputed from its answers alone (an ITEM_COLUMNS table): the numbers
`evaluate_robustness` gives, for answers that were not scored as one prompt — an ensemble's, whose clean and
perturbed answers are its members' combined (promptopt/workflows/ensemble.py)."""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from promptopt.metrics.stats import format_spread
from promptopt.robustness.suite.evaluate import summarize
from promptopt.robustness.suite.spec import Suite


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
    return summarize(
        suite,
        clean_correct,
        variants_long,
        n_items=len(clean_correct),
        tcb_clean=clean_rows["clean_tcb"],
        tcb_perturbed=variant_rows["perturbed_tcb"],
        spreads=spreads,
        seen=seen,
    )


__all__ = ["robustness_from_items"]
