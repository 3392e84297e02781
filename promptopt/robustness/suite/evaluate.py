"""A prompt's robustness under a suite, on one set of items: every family's variants scored beside the clean items.

Per family: how many variants were made and dropped (not applicable / protection / unchanged /
similarity), perturbed accuracy, clean accuracy on the same items, PDR, mean δ_TCB clean vs perturbed.
Summary: every metric on the same items (formulas in `promptopt.metrics.stats.robustness_metrics`) —
PDR as the mean of per-family PDRs (PromptBench) and pooled, Acc_worst per item (right on the clean
prompt and on every kept variant), AccVar_pert as the mean per-item variance over an item's versions,
each with a seeded 95% bootstrap interval over items; the family-level numbers keep their own names.
PDR is NaN, and said so, when clean accuracy is 0.

Seen and unseen: given the family names a search looked at (`seen_families(suite, search_suite)`), every
family is labelled, and the summary repeats the item-level metrics over the unseen families alone and over
the seen ones alone (`acc_worst_unseen`, `pdr_seen`, ...). The result also keeps every answer
(`RobustnessResult.items`, `items.ITEM_COLUMNS`): one row per kept variant, and one clean row per item.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt import progress as steps
from promptopt.metrics.stats import format_spread, performance_drop_rate, robustness_intervals, robustness_metrics
from promptopt.prompts import Prompt
from promptopt.robustness.perturb import ParaphraseMemo, Variant
from promptopt.robustness.suite.items import items_table
from promptopt.robustness.suite.similarity import Similarity
from promptopt.robustness.suite.spec import Suite
from promptopt.robustness.suite.variants import make_variants
from promptopt.scoring import PromptScorer
from promptopt.tasks import Item

SPLITS = ("unseen", "seen")
_SPLIT_KEYS = ("acc_worst", "pdr", "pdr_pooled", "acc_var_pert", "acc_worst_family_min", "acc_worst_family")


@dataclass
class RobustnessResult:
    families: pd.DataFrame
    summary: dict
    variants: pd.DataFrame
    items: pd.DataFrame | None = None  # ITEM_COLUMNS: every answer, clean and perturbed


def evaluate_robustness(
    scorer: PromptScorer,
    prompt: Prompt,
    items: list[Item],
    suite: Suite,
    *,
    pool: list[Item],
    similarity: Similarity | None = None,
    paraphrases: ParaphraseMemo | None = None,
    progress: bool = False,
    desc: str = "robustness",
    seen: Collection[str] | None = None,
) -> RobustnessResult:
    """Every family of `suite` on `items`: variants made, filtered and scored beside the clean items.
    `similarity` and `paraphrases` memoize embeddings and LM paraphrases across calls (pass the session's).
    `seen`: the family names a search looked at (`seen_families`); None leaves families unlabelled."""
    from tqdm.auto import tqdm

    similarity = similarity or Similarity()
    clean = scorer.score(prompt, items).table.set_index("item_id")
    context = {
        "pool": pool,
        "evaluated": {i.id for i in items},
        "distractors": list(suite.distractors),
        "lm": scorer.lm,
        "runner": scorer.runner,
        "paraphrases": paraphrases or ParaphraseMemo(),
    }
    rows, variant_rows, spreads = [], [], {}
    originals = {item.id: item.question for item in items}
    families = (
        tqdm(suite.families, desc=desc, leave=False)
        if progress
        else steps.iterate(suite.families, f"{desc}: family", label=lambda f: f.name)  # silent unless a command asked
    )
    for family in families:
        kept, counts = make_variants(suite, family, prompt, items, context, similarity)
        tables = []
        groups: dict[str, list[Variant]] = {}
        for variant in kept:
            groups.setdefault(json.dumps(variant.prompt.to_card(), sort_keys=True), []).append(variant)
        for group in groups.values():
            table = scorer.score(group[0].prompt, [v.item for v in group]).table
            table["question"] = [v.item.question for v in group]
            # a changed question is the variant; else the prompt is (exemplars, format): keep what the model saw
            changed = [v.item.question != originals.get(v.item.id) for v in group]
            table["variant_kind"] = ["question" if c else "prompt" for c in changed]
            table["variant_text"] = [
                v.item.question if c else _rendered(scorer, group[0].prompt, v.item) for v, c in zip(group, changed)
            ]
            tables.append(table)
        perturbed = (
            pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["item_id", "correct", "tcb"])
        )
        same = clean.loc[perturbed["item_id"]] if len(perturbed) else clean.iloc[:0]
        acc_clean_same = float(same["correct"].mean()) if len(same) else float("nan")
        acc_pert = float(perturbed["correct"].mean()) if len(perturbed) else float("nan")
        rows.append(
            {
                "family": family.name,
                "operator": family.operator,
                **({"seen": family.name in seen} if seen is not None else {}),
                "n_items": len(items),
                "n_variants": len(perturbed),
                **{f"dropped_{k}": v for k, v in counts.items()},
                "acc_clean_same_items": acc_clean_same,
                "acc_perturbed": acc_pert,
                "pdr": performance_drop_rate(acc_clean_same, acc_pert) if len(perturbed) else float("nan"),
                "tcb_clean_mean": _finite_mean(same["tcb"]) if len(same) else float("nan"),
                "tcb_perturbed_mean": _finite_mean(perturbed["tcb"]) if len(perturbed) else float("nan"),
            }
        )
        if (
            family.operator == "format"
        ):  # every group is one format of the prompt: the spread over them and the clean one
            spreads[family.name] = _format_spread(clean["correct"], tables, seed=suite.seed)
            rows[-1].update(
                format_spread=spreads[family.name]["spread"],
                format_spread_ci_low=spreads[family.name]["ci95"][0],
                format_spread_ci_high=spreads[family.name]["ci95"][1],
                n_formats=spreads[family.name]["n_formats"],
            )
        if len(perturbed):
            variant_rows.append(perturbed.assign(family=family.name, operator=family.operator))
    families = pd.DataFrame(rows)
    variants_long = (
        pd.concat(variant_rows, ignore_index=True)[["item_id", "family", "correct"]]
        if variant_rows
        else pd.DataFrame(columns=["item_id", "family", "correct"])
    )
    if seen is not None:
        variants_long["seen"] = variants_long["family"].isin(set(seen))
    summary = summarize(
        suite,
        clean["correct"].astype(bool),
        variants_long,
        n_items=len(items),
        tcb_clean=clean["tcb"],
        tcb_perturbed=pd.concat([t["tcb"] for t in variant_rows]) if variant_rows else [],
        spreads=spreads,
        seen=seen,
    )
    variants = pd.concat(variant_rows, ignore_index=True) if variant_rows else pd.DataFrame()
    return RobustnessResult(families, summary, variants, items_table(clean, variants, seen, items))


def summarize(
    suite: Suite,
    clean_correct: pd.Series,
    variants_long: pd.DataFrame,
    *,
    n_items: int,
    tcb_clean,
    tcb_perturbed,
    spreads: dict,
    seen: Collection[str] | None,
) -> dict:
    """The summary of a stressed prompt from its clean answers (item_id -> correct) and every variant's answer
    (item_id, family, correct): accuracy under every family, PDR, Acc_worst, AccVar with their item-bootstrap
    intervals, the first format family's spread, and (families labelled) the seen and unseen splits. One place for
    a prompt scored whole (`evaluate_robustness`) and for answers combined afterwards (`robustness_from_items`)."""
    metrics = robustness_metrics(clean_correct, variants_long)
    intervals = robustness_intervals(clean_correct, variants_long, seed=suite.seed)
    acc_clean = metrics["acc_clean"]
    summary = {
        "suite": suite.name,
        "n_items": n_items,
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
        "tcb_clean_mean": _finite_mean(tcb_clean),
        "tcb_perturbed_mean": _finite_mean(tcb_perturbed),
    }
    if spreads:  # the first format family's spread (FormatSpread: max − min accuracy over the prompt's formats)
        name, first = next(iter(spreads.items()))
        summary.update(
            format_spread=first["spread"],
            format_spread_ci95=first["ci95"],
            format_spread_n_formats=first["n_formats"],
            format_spread_family=name,
        )
    if spreads and seen is not None:  # and labelled: the first format family the search saw, and the first it did not
        for split in SPLITS:
            names = [name for name in spreads if (name in seen) == (split == "seen")]
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


def split_summary(
    clean_correct: pd.Series, variants_long: pd.DataFrame, families: list[str], seen: Collection[str], *, seed: int
) -> dict:
    """The item-level metrics over the unseen families alone and over the seen ones alone (each on every item:
    an item no family of the split perturbed counts as its clean answer). NaN for a split with no family."""
    seen = set(seen)
    out = {
        "families_seen": [f for f in families if f in seen],
        "families_unseen": [f for f in families if f not in seen],
    }
    for split in SPLITS:
        names = out[f"families_{split}"]
        if not names:
            out.update({f"{key}_{split}": (None if key == "acc_worst_family" else float("nan")) for key in _SPLIT_KEYS})
            out.update({f"{key}_{split}_ci95": [float("nan"), float("nan")] for key in ("acc_worst", "pdr")})
            continue
        part = variants_long[variants_long["family"].isin(names)][["item_id", "family", "correct"]]
        m = robustness_metrics(clean_correct, part)
        ci = robustness_intervals(clean_correct, part, seed=seed)
        out.update(
            {
                f"acc_worst_{split}": m["acc_worst"],
                f"acc_worst_{split}_ci95": ci["acc_worst_ci95"],
                f"pdr_{split}": m["pdr"],
                f"pdr_{split}_ci95": ci["pdr_ci95"],
                f"pdr_pooled_{split}": m["pdr_pooled"],
                f"acc_var_pert_{split}": m["acc_var"],
                f"acc_worst_family_min_{split}": m["acc_worst_family_min"],
                f"acc_worst_family_{split}": m["acc_worst_family"],
            }
        )
    return out


def _rendered(scorer, prompt: Prompt, item: Item) -> str:
    """The text the model was shown for a prompt-level variant (exemplars, format): the variant is the prompt."""
    tokenizer = getattr(getattr(scorer, "lm", None), "tokenizer", None)
    return item.question if tokenizer is None else prompt.context(item.question, item.choices, tokenizer)


def _format_spread(clean_correct: pd.Series, tables: list[pd.DataFrame], *, seed: int) -> dict:
    """Items × formats (the prompt's own first) -> format_spread on the items every format has."""
    columns = [clean_correct.astype(float)] + [t.set_index("item_id")["correct"].astype(float) for t in tables]
    matrix = pd.concat(columns, axis=1).reindex(clean_correct.index)
    return format_spread(matrix.to_numpy(), seed=seed)


def _finite_mean(values) -> float:
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    return float(arr.mean()) if len(arr) else float("nan")
