"""Every answer of a robustness evaluation as one table (ITEM_COLUMNS): what `robustness_items.parquet` holds, from
which every robustness number can be recomputed."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from promptopt.tasks import Item

# One row per kept variant (and one clean row per item, family null): what `robustness_items.parquet` holds.
ITEM_SIGNALS = ("tcb", "margin", "top_prob", "entropy", "v_eff")  # read at the critical point, clean and perturbed
ITEM_COLUMNS = [
    "item_id",
    "family",
    "operator",
    "variant",
    "seen",
    "clean_correct",
    "perturbed_correct",
    "clean_prediction",
    "perturbed_prediction",
    *(f"{side}_{name}" for name in ITEM_SIGNALS for side in ("clean", "perturbed")),
    "variant_kind",
    "variant_text",
    "gold",  # choice tasks: the gold index, and each answer's decision scores (an ensemble combines its members')
    "clean_scores",
    "perturbed_scores",
]


def items_table(
    clean: pd.DataFrame, variants: pd.DataFrame, seen: Collection[str] | None, items: list[Item]
) -> pd.DataFrame:
    """ITEM_COLUMNS from the clean per-item table (indexed by item_id) and the scored variants: one clean row per
    item (family, variant, seen and the perturbed columns null), then one row per variant, numbered per (item,
    family) in the order the suite made them. Predictions are text (a choice index for log-likelihood tasks)."""

    def signal(frame, name):
        return frame[name].astype(float).to_numpy() if name in frame else np.full(len(frame), np.nan)

    def scores(frame):
        if "decision_scores" not in frame:
            return [None] * len(frame)
        return [None if s is None else [float(x) for x in s] for s in frame["decision_scores"]]

    def gold(frame):
        return frame["gold"].to_numpy() if "gold" in frame and "decision_scores" in frame else [None] * len(frame)

    c = clean.reindex([i.id for i in items])
    base = {
        "item_id": list(c.index),
        "clean_correct": c["correct"].astype(bool).to_numpy(),
        "clean_prediction": c["pred"].astype(str).to_numpy(),
        **{f"clean_{n}": signal(c, n) for n in ITEM_SIGNALS},
        "gold": gold(c),
        "clean_scores": scores(c),
    }
    clean_rows = pd.DataFrame({**base, "variant_kind": "clean", "variant_text": [i.question for i in items]})
    parts = [clean_rows]
    if len(variants):
        v = variants.reset_index(drop=True)
        same = clean.loc[v["item_id"]]
        parts.append(
            pd.DataFrame(
                {
                    "item_id": v["item_id"].to_numpy(),
                    "family": v["family"].to_numpy(),
                    "operator": v["operator"].to_numpy(),
                    "variant": v.groupby(["family", "item_id"], sort=False).cumcount().to_numpy(),
                    "clean_correct": same["correct"].astype(bool).to_numpy(),
                    "perturbed_correct": v["correct"].astype(bool).to_numpy(),
                    "clean_prediction": same["pred"].astype(str).to_numpy(),
                    "perturbed_prediction": v["pred"].astype(str).to_numpy(),
                    **{f"clean_{n}": signal(same, n) for n in ITEM_SIGNALS},
                    **{f"perturbed_{n}": signal(v, n) for n in ITEM_SIGNALS},
                    "variant_kind": v["variant_kind"].to_numpy(),
                    "variant_text": v["variant_text"].astype(str).to_numpy(),
                    "gold": gold(same),
                    "clean_scores": scores(same),
                    "perturbed_scores": scores(v),
                }
            )
        )
    table = pd.concat(parts, ignore_index=True).reindex(columns=ITEM_COLUMNS)
    table["variant"] = table["variant"].astype("Int64")
    table["perturbed_correct"] = table["perturbed_correct"].astype("boolean")
    for name in ("family", "operator", "perturbed_prediction"):
        table[name] = table[name].astype(object).where(table[name].notna(), None)
    labels = table["family"].map(lambda f: None if f is None else (f in set(seen)) if seen is not None else None)
    table["seen"] = labels.astype("boolean")
    return table
