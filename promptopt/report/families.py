"""Per-family robustness from `robustness_items.parquet` (one row per strategy, seed, item, family and
variant): clean and perturbed accuracy on the same items with Wilson intervals, PDR with an item
bootstrap, and the flip states of one prompt's answers. The file's column names are read through a few
aliases, so the report follows the table as it settles; `seen`/`unseen` labels are kept apart if present."""

from __future__ import annotations

import numpy as np
import pandas as pd

from promptopt.metrics.stats import bootstrap_resamples, percentile_interval, performance_drop_rate, wilson_interval

ALIASES = {
    "item": ("item_id", "item"),
    "family": ("family",),
    "variant": ("variant", "variant_id", "variant_index"),
    "clean": ("clean_correct", "correct_clean"),
    "perturbed": ("perturbed_correct", "correct_perturbed", "correct"),
    "clean_pred": ("clean_prediction", "prediction_clean", "clean_pred", "pred_clean"),
    "perturbed_pred": (
        "perturbed_prediction",
        "prediction_perturbed",
        "perturbed_pred",
        "pred_perturbed",
        "prediction",
        "pred",
    ),
    "text": ("variant_text", "perturbed_text", "text", "question"),
    "group": ("perturbations", "seen_unseen", "suite_role", "seen"),
}
FLIPS = ("still right", "still wrong", "fixed", "broken")  # codes 0..3 of the flip map


def column(frame: pd.DataFrame, role: str) -> str | None:
    return next((c for c in ALIASES[role] if c in frame.columns), None)


def usable(frame: pd.DataFrame | None) -> bool:
    return (
        frame is not None
        and all(column(frame, r) for r in ("item", "family", "clean", "perturbed"))
        and len(variant_rows(frame)) > 0
    )


def variant_rows(items: pd.DataFrame) -> pd.DataFrame:
    """The perturbed answers only: compare and evaluate also keep one clean row per item (family null)."""
    return items[items[column(items, "family")].notna()]


def group_labels(frame: pd.DataFrame) -> pd.Series:
    """'seen' / 'unseen' per row where the table says which, else '' (one group)."""
    name = column(frame, "group")
    if name is None:
        return pd.Series("", index=frame.index)
    values = frame[name]
    if set(values.dropna().unique()) <= {True, False}:  # a bool column, nullable or not
        return values.map({True: "seen", False: "unseen"}).fillna("").astype(str)
    return values.astype(str)


def family_table(items: pd.DataFrame, *, n_boot: int = 500, seed: int = 0) -> pd.DataFrame:
    """One row per (strategy, group, family): n items, n variants, clean/perturbed accuracy, PDR, intervals."""
    items = variant_rows(items)
    item, family = column(items, "item"), column(items, "family")
    frame = pd.DataFrame(
        {
            "strategy": items["strategy"].astype(str) if "strategy" in items else "",
            "group": group_labels(items),
            "family": items[family].astype(str),
            "key": (items["seed"].astype(str) + ":" if "seed" in items else "")
            + items[item].astype(str),  # (seed, item)
            "clean": items[column(items, "clean")].astype(bool).astype(float),
            "perturbed": items[column(items, "perturbed")].astype(bool).astype(float),
        }
    )
    rows = []
    for (strategy, group, fam), part in frame.groupby(["strategy", "group", "family"], sort=False):
        per_item = part.groupby("key", sort=False)[["clean", "perturbed"]].agg(["sum", "count"])
        clean_sum, pert_sum = per_item[("clean", "sum")].to_numpy(), per_item[("perturbed", "sum")].to_numpy()
        count = per_item[("clean", "count")].to_numpy()
        n = int(count.sum())
        acc_clean, acc_pert = clean_sum.sum() / n, pert_sum.sum() / n

        low, high = _pdr_interval(clean_sum, pert_sum, count, n_boot=n_boot, seed=seed)
        rows.append(
            {
                "strategy": strategy,
                "group": group,
                "family": fam,
                "n_items": len(count),
                "n_variants": n,
                "acc_clean": acc_clean,
                "acc_clean_ci": wilson_interval(int(clean_sum.sum()), n),
                "acc_perturbed": acc_pert,
                "acc_perturbed_ci": wilson_interval(int(pert_sum.sum()), n),
                "pdr": performance_drop_rate(acc_clean, acc_pert),
                "pdr_ci": (low, high),
            }
        )
    return pd.DataFrame(rows)


def _pdr_interval(clean_sum, pert_sum, count, *, n_boot: int, seed: int) -> tuple[float, float]:
    """The bootstrap interval of a family's pooled PDR over items (each with its variants), every resample at once:
    per resample 1 − (perturbed correct / variants) / (clean correct / variants), undefined where the clean is 0."""
    resamples = bootstrap_resamples(len(count), n_boot=n_boot, seed=seed)
    total = count[resamples].sum(-1)
    acc_clean, acc_pert = clean_sum[resamples].sum(-1) / total, pert_sum[resamples].sum(-1) / total
    with np.errstate(divide="ignore", invalid="ignore"):
        return percentile_interval(np.where(acc_clean == 0, np.nan, 1.0 - acc_pert / acc_clean))


def flips(items: pd.DataFrame) -> pd.DataFrame:
    """One row per (item, family) of one prompt: the flip code (worst variant: broken > fixed > unchanged)
    and a hover text with every variant's answers and text."""
    items = variant_rows(items)
    item, family, text = column(items, "item"), column(items, "family"), column(items, "text")
    clean_pred, pert_pred = column(items, "clean_pred"), column(items, "perturbed_pred")
    clean = items[column(items, "clean")].astype(bool).to_numpy()
    pert = items[column(items, "perturbed")].astype(bool).to_numpy()
    code = np.where(clean & pert, 0, np.where(~clean & ~pert, 1, np.where(~clean & pert, 2, 3)))
    frame = items.assign(_code=code)
    rows = []
    for (i, fam), part in frame.groupby([item, family], sort=False):
        lines = []
        for _, r in part.head(4).iterrows():
            answer = (
                f"{r[clean_pred]} → {r[pert_pred]}"
                if clean_pred and pert_pred
                else f"{r[pert_pred]}"
                if pert_pred
                else ""
            )
            variant_text = str(r[text])[:220] + ("…" if len(str(r[text])) > 220 else "") if text else ""
            lines.append(f"{FLIPS[int(r['_code'])]}: {answer}<br>{_wrap(variant_text)}")
        more = f"<br>(+{len(part) - 4} more variants)" if len(part) > 4 else ""
        rows.append(
            {
                "item": str(i),
                "family": str(fam),
                "code": int(part["_code"].max()),
                "hover": f"item {i} · {fam} · {len(part)} variant(s)<br>" + "<br>".join(lines) + more,
            }
        )
    return pd.DataFrame(rows)


def _wrap(text: str, width: int = 70) -> str:
    import html
    import textwrap

    return "<br>".join(html.escape(line) for line in textwrap.wrap(text, width)) or "(no variant text)"
