"""Robustness of one prompt from per-item correctness, every metric on the same items: PDR (per family, their
mean and pooled), Acc_worst, AccVar, FormatSpread, with bootstrap intervals that resample items together with
their variants."""

from __future__ import annotations

from promptopt.metrics.stats.bootstrap import bootstrap_draws, bootstrap_resamples, percentile_interval


def performance_drop_rate(acc_clean: float, acc_perturbed: float) -> float:
    """PDR = 1 − Acc_perturbed / Acc_clean (PromptBench). Negative when perturbation helps; NaN when
    Acc_clean = 0, where the ratio is undefined (callers report it as such)."""
    if acc_clean == 0:
        return float("nan")
    return 1.0 - acc_perturbed / acc_clean


def accuracy_variance(accuracies: list[float]) -> float:
    """AccVar_pert: population variance of the per-family perturbed accuracies."""
    if not accuracies:
        return float("nan")
    mean = sum(accuracies) / len(accuracies)
    return sum((a - mean) ** 2 for a in accuracies) / len(accuracies)


def worst_case(accuracies: dict[str, float]) -> tuple[str | None, float]:
    """Acc_worst and the family it comes from (NaN values ignored)."""
    valid = {k: v for k, v in accuracies.items() if v == v}
    if not valid:
        return None, float("nan")
    family = min(valid, key=lambda k: (valid[k], k))
    return family, valid[family]


def format_spread(correct, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """FormatSpread (arXiv 2310.11324): max − min accuracy over the formats of one prompt, on the same items.

    correct: items × formats (0/1; NaN where an item has no variant in that format — those items are left out,
    so every format is measured on the same items). The interval resamples items (all formats of an item
    together), so it says how much of the spread the item sample alone could make."""
    import numpy as np

    matrix = np.asarray(correct, dtype=float)
    matrix = matrix[~np.isnan(matrix).any(axis=1)]
    n_items, n_formats = matrix.shape if matrix.ndim == 2 else (0, 0)
    if n_items == 0 or n_formats < 2:
        return {
            "spread": float("nan"),
            "ci95": [float("nan"), float("nan")],
            "n_items": int(n_items),
            "n_formats": int(n_formats),
        }
    accuracies = matrix.mean(axis=0)
    # every resample at once: its per-format sums are (how often each item was drawn) · matrix, integers as exact in
    # float64 as the loop's sums over `matrix[idx]`, so the interval is `bootstrap_interval`'s bit for bit
    sums = bootstrap_draws(n_items, n_boot=n_boot, seed=seed).astype(float) @ matrix
    low, high = percentile_interval(np.ptp(sums / n_items, axis=-1))
    return {
        "spread": float(np.ptp(accuracies)),
        "ci95": [low, high],
        "n_items": int(n_items),
        "n_formats": int(n_formats),
        "accuracies": [float(a) for a in accuracies],
    }


class PerItemRobustness:
    """Per-item counts behind every robustness metric: clean correctness, and per family the number of
    kept variants and how many were correct. Metrics on any (re)sample of items are a few reductions."""

    def __init__(self, clean, variants) -> None:
        import numpy as np
        import pandas as pd

        clean = pd.Series(clean, dtype=bool)
        v = (
            variants
            if isinstance(variants, pd.DataFrame)
            else pd.DataFrame(variants, columns=["item_id", "family", "correct"])
        )
        unknown = set(v["item_id"]) - set(clean.index)
        if unknown:
            raise ValueError(f"variants of items without a clean result: {sorted(unknown)[:3]}")
        self.items = list(clean.index)
        self.families = sorted(v["family"].unique()) if len(v) else []
        row = {item: i for i, item in enumerate(self.items)}
        col = {family: j for j, family in enumerate(self.families)}
        self.clean = clean.to_numpy(dtype=float)
        self.n = np.zeros((len(self.items), len(self.families)))
        self.k = np.zeros_like(self.n)
        for item, family, correct in zip(v["item_id"], v["family"], v["correct"].astype(bool)):
            self.n[row[item], col[family]] += 1
            self.k[row[item], col[family]] += correct

    def metrics(self, index=None) -> dict:
        import numpy as np

        idx = np.arange(len(self.items)) if index is None else np.asarray(index)
        clean, n, k = self.clean[idx], self.n[idx], self.k[idx]
        out = {"acc_clean": float(clean.mean()) if len(idx) else float("nan")}
        family_acc, family_pdr = {}, {}
        for j, family in enumerate(self.families):
            touched = n[:, j] > 0
            if not touched.any():
                family_acc[family] = family_pdr[family] = float("nan")
                continue
            family_acc[family] = float(k[:, j].sum() / n[:, j].sum())
            family_pdr[family] = performance_drop_rate(float(clean[touched].mean()), family_acc[family])
        defined = [x for x in family_pdr.values() if x == x]
        n_item, k_item = n.sum(1), k.sum(1)
        out["pdr"] = float(np.mean(defined)) if defined else float("nan")
        out["pdr_pooled"] = (
            performance_drop_rate(float((clean * n_item).sum() / n_item.sum()), float(k_item.sum() / n_item.sum()))
            if n_item.sum()
            else float("nan")
        )
        all_ok = k_item == n_item
        out["acc_worst"] = float((clean.astype(bool) & all_ok).mean()) if len(idx) else float("nan")
        worst_family, out["acc_worst_family_min"] = worst_case(family_acc)
        out["acc_worst_family"] = worst_family
        versions = 1 + n_item  # the clean version and every kept variant
        mean = (clean + k_item) / versions
        out["acc_var"] = float((mean * (1 - mean)).mean()) if len(idx) else float("nan")  # Bernoulli variance per item
        out["acc_var_families"] = accuracy_variance([x for x in family_acc.values() if x == x])
        out["pdr_by_family"] = family_pdr
        out["acc_by_family"] = family_acc
        return out

    def resampled_metrics(self, resamples) -> dict:
        """acc_worst, acc_var, pdr and pdr_pooled of every resample (rows of item indices) at once, an array each:
        `metrics(row)`'s numbers, the same sums in the same order, without a Python call per resample. Rows go in
        blocks that keep the (rows, items, families) arrays near 2^21 numbers, whatever the sizes."""
        import numpy as np

        resamples = np.asarray(resamples)
        rows = max(1, (1 << 21) // max(1, resamples.shape[1] * len(self.families)))
        parts = [self._resampled_block(resamples[start : start + rows]) for start in range(0, len(resamples), rows)]
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]} if parts else {}

    def _resampled_block(self, resamples) -> dict:
        import numpy as np

        clean, n, k = (
            self.clean[resamples],
            self.n[resamples],
            self.k[resamples],
        )  # (rows, items) and (rows, items, families)
        n_item, k_item = n.sum(-1), k.sum(-1)
        mean = (clean + k_item) / (1 + n_item)
        touched = n > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            clean_touched = (clean[..., None] * touched).sum(1) / touched.sum(1)  # NaN for a family no item has
            family_pdr = 1.0 - (k.sum(1) / n.sum(1)) / clean_touched
            family_pdr[clean_touched == 0] = np.nan  # performance_drop_rate: undefined when the clean accuracy is 0
            defined = ~np.isnan(family_pdr)
            pdr = np.where(defined, family_pdr, 0.0).sum(-1) / defined.sum(-1)
            pooled_clean = (clean * n_item).sum(-1) / n_item.sum(-1)
            pdr_pooled = np.where(pooled_clean == 0, np.nan, 1.0 - (k_item.sum(-1) / n_item.sum(-1)) / pooled_clean)
        return {
            "acc_worst": (clean.astype(bool) & (k_item == n_item)).mean(-1),
            "acc_var": (mean * (1 - mean)).mean(-1),
            "pdr": pdr,
            "pdr_pooled": pdr_pooled,
        }


def robustness_metrics(clean, variants) -> dict:
    """Robustness of one prompt from per-item correctness, every metric on the same items.

    clean: mapping item_id -> correct on the clean prompt (every evaluated item).
    variants: rows (item_id, family, correct) for every kept perturbed variant.

    - acc_clean            = mean_i clean_i
    - pdr_by_family[f]     = 1 − acc(variants of f) / mean(clean_i | items f perturbed)
    - pdr (PromptBench)    = mean over families of their PDR (families where it is defined)
    - pdr_pooled           = 1 − acc(all variants) / mean(clean of each variant's item)
    - acc_worst            = mean_i [clean_i ∧ every kept variant of i correct]   (robust accuracy)
    - acc_worst_family_min = min over families of acc(variants of f)   (families cover unequal item sets)
    - acc_var              = mean_i Var(correctness over i's clean + perturbed versions)
    - acc_var_families     = population variance of the family accuracies
    """
    return PerItemRobustness(clean, variants).metrics()


def robustness_intervals(clean, variants, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """95% bootstrap intervals for acc_worst, acc_var, pdr and pdr_pooled, resampling items together
    with their variants (seeded: the same call gives the same interval)."""
    per_item = PerItemRobustness(clean, variants)
    names = ("acc_worst", "acc_var", "pdr", "pdr_pooled")
    if not per_item.items:
        return {f"{name}_ci95": [float("nan"), float("nan")] for name in names}
    together = per_item.resampled_metrics(bootstrap_resamples(len(per_item.items), n_boot=n_boot, seed=seed))
    return {f"{name}_ci95": list(percentile_interval(together[name])) for name in names}
