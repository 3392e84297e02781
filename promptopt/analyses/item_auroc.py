"""Does a clean answer's signal flag the answers a perturbation the search never saw will change?

The δ_TCB paper's "accurate but unstable" claim, made testable on the user's own task: from every answer kept
in a robustness items table (`robustness_items.parquet` of `compare` or `evaluate`, or the one `diagnose proxy`
writes), one row per answer (a prompt's clean answer to one item), labelled *changed* when the prediction of
some variant of an unseen family differs from the clean prediction. Answers no unseen family perturbed are
left out (nothing says whether they would change).

Each signal is read on the clean answer and oriented so that a higher score means "flagged as brittle":

- δ_TCB: score −log10 δ_TCB (a small δ, a nearby token flip, is brittle; δ = +inf, the most stable, ranks lowest)
- margin, P(top1): score −value (a small lead is brittle)
- entropy, V_eff: score +value (many competitors is brittle)

AUROC = P(score of a changed answer > score of an unchanged one), ties half (0.5 = no better than chance,
above 0.5 = the signal flags brittle answers). The 95% interval resamples items, each with all its answers
(several prompts or seeds answer the same item, and those answers are not independent):
`promptopt.metrics.stats.clustered_auroc_interval`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from promptopt.errors import UserError
from promptopt.metrics.stats import auroc, clustered_auroc_interval

# name, items column (clean answer), orientation (+1: high is brittle, -1: low is brittle), transform before it
SIGNALS = (
    ("log10_tcb", "clean_tcb", -1, "low δ_TCB ⇒ brittle (score −log10 δ_TCB)"),
    ("margin", "clean_margin", -1, "low margin ⇒ brittle (score −margin)"),
    ("top_prob", "clean_top_prob", -1, "low P(top1) ⇒ brittle (score −P(top1))"),
    ("entropy", "clean_entropy", +1, "high entropy ⇒ brittle (score +entropy)"),
    ("v_eff", "clean_v_eff", +1, "high V_eff ⇒ brittle (score +V_eff)"),
)
ANSWER_KEYS = ("strategy", "seed", "prompt", "source")  # whichever the table has, with item_id: one answer


def answers(items: pd.DataFrame, *, split: str = "unseen") -> pd.DataFrame:
    """One row per answer that has a variant of a `split` family: its key, clean signals, `n_variants` and
    `changed` (some such variant's prediction differs from the clean one)."""
    needed = {"item_id", "family", "seen", "clean_prediction", "perturbed_prediction"}
    missing = needed - set(items.columns)
    if missing:
        raise UserError(
            f"robustness items table: missing column {sorted(missing)[0]} (expected robustness_items.parquet "
            "as compare or evaluate write it)"
        )
    if split not in ("unseen", "seen"):
        raise UserError(f"split: expected unseen or seen, got {split!r}")
    keys = [k for k in ANSWER_KEYS if k in items.columns] + ["item_id"]
    variants = items[items["family"].notna() & items["seen"].notna()]
    variants = variants[variants["seen"].astype(bool) == (split == "seen")]
    if not len(variants):
        return pd.DataFrame(columns=[*keys, *(c for _, c, _, _ in SIGNALS), "n_variants", "changed"])
    flips = variants.assign(
        _changed=variants["perturbed_prediction"].astype(str) != variants["clean_prediction"].astype(str)
    )
    per_answer = (
        flips.groupby(keys, sort=False).agg(n_variants=("_changed", "size"), changed=("_changed", "any")).reset_index()
    )
    signals = [c for _, c, _, _ in SIGNALS if c in items.columns]
    clean = items.drop_duplicates(keys)[keys + signals]  # every row of an answer carries its clean signals
    return per_answer.merge(clean, on=keys, how="left")


def _oriented(values: np.ndarray, sign: int, log: bool) -> np.ndarray:
    """The score (higher = flagged as brittle), infinities kept in order as finite values beyond the rest
    (auroc drops non-finite scores, and δ = +inf is an answer, the most stable one)."""
    x = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log10(x) if log else x.copy()
    score = sign * x
    finite = score[np.isfinite(score)]
    low, high = (finite.min() - 1, finite.max() + 1) if len(finite) else (-1.0, 1.0)
    score[score == np.inf], score[score == -np.inf] = high, low
    return score


def item_auroc(items: pd.DataFrame, *, split: str = "unseen", n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The AUROC (95% interval over items) of each clean signal for "this answer changes under some `split`
    perturbation": one row per signal (`SIGNALS`), with the orientation used and the counts it rests on."""
    table = answers(items, split=split)
    labels = table["changed"].astype(bool).to_numpy() if len(table) else np.zeros(0, dtype=bool)
    cluster = table.groupby("item_id", sort=False).ngroup().to_numpy() if len(table) else np.zeros(0, dtype=int)
    n_items = int(cluster.max()) + 1 if len(cluster) else 0
    rows = []
    for name, col, sign, orientation in SIGNALS:
        values = table[col].to_numpy(dtype=float) if col in table else np.full(len(table), np.nan)
        score = _oriented(values, sign, log=name == "log10_tcb")
        keep = ~np.isnan(score)
        point = auroc(score, labels)
        low, high = clustered_auroc_interval(score, labels, cluster, n_boot=n_boot, seed=seed)
        rows.append(
            {
                "signal": name,
                "orientation": orientation,
                "split": split,
                "n_answers": int(keep.sum()),
                "n_items": n_items,
                "n_changed": int(labels[keep].sum()),
                "auroc": point,
                "ci_low": low,
                "ci_high": high,
                "interval_excludes_half": bool(low > 0.5 or high < 0.5),
            }
        )
    return pd.DataFrame(rows)
