"""Evaluating a prompt for a compare: its test answers, and its answers under the judging suite (and taboo
retention at i = 1 for generative tasks), once per distinct prompt; finished evaluations are kept on disk so a
resumed compare reuses them instead of scoring and stressing again."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.card import sha256_json
from promptopt.study.recovery import fault_point
from promptopt.tasks.item import items_sha256
from promptopt.yamlio import atomic_write_text, write_table


@dataclass
class Evaluated:
    """One prompt evaluated on the test items (and, with a suite, under perturbation)."""

    test: pd.DataFrame  # per-item test table
    robust: dict = field(default_factory=dict)  # robustness summary (+ taboo) on the robustness items
    clean: pd.Series | None = None  # item_id -> correct, robustness items
    variants: pd.DataFrame | None = None  # item_id, family, correct (and seen, where the families were labelled)
    items: pd.DataFrame | None = None  # every answer, clean and perturbed (robustness.suite.ITEM_COLUMNS)
    rule: dict | None = None  # the decision rule its answers were decided by, fit on the dev items (a card's)


class EvaluationStore:
    """Finished evaluations, one folder each under <out>/evaluations/<key>: a resumed compare reuses them
    instead of scoring and stressing again. The key covers what an evaluation depends on (prompt card,
    test items, suite, robustness items, model); every file is written atomically and `done.json` last, so
    an evaluation cut short is redone."""

    def __init__(self, folder: Path, context: dict) -> None:
        self.folder, self.context = folder, context

    @staticmethod
    def any_in(folder: Path) -> bool:
        return folder.is_dir() and any(folder.glob("*/done.json"))

    def key(self, prompt, kind: str) -> str:
        return sha256_json([kind, prompt.to_card(), self.context])[:24]

    def load(self, key: str) -> Evaluated | None:
        folder = self.folder / key
        if not (folder / "done.json").is_file():
            return None
        done = json.loads((folder / "done.json").read_text(encoding="utf-8"))
        evaluated = Evaluated(
            pd.read_parquet(folder / "test.parquet") if done["test"] else None,
            robust=done["robust"],
            rule=done.get("rule"),
        )
        if done["clean"]:
            evaluated.clean = pd.read_parquet(folder / "clean.parquet").set_index("item_id")["correct"]
            evaluated.variants = pd.read_parquet(folder / "variants.parquet")
        if done.get("items"):
            evaluated.items = pd.read_parquet(folder / "items.parquet")
        return evaluated

    def save(self, key: str, evaluated: Evaluated) -> None:
        folder = self.folder / key
        if evaluated.test is not None:
            write_table(evaluated.test, folder / "test.parquet")
        if evaluated.clean is not None:
            write_table(evaluated.clean.reset_index(), folder / "clean.parquet")
            write_table(evaluated.variants, folder / "variants.parquet")
        if evaluated.items is not None:
            write_table(evaluated.items, folder / "items.parquet")
        done = {
            "test": evaluated.test is not None,
            "clean": evaluated.clean is not None,
            "items": evaluated.items is not None,
            "robust": evaluated.robust,
            "rule": evaluated.rule,
        }
        atomic_write_text(folder / "done.json", json.dumps(done, indent=1))


_TEST_COLUMNS = ["item_id", "correct", "tcb", "ppl"]  # what the tables read of a prompt's test items
# and, for choice tasks, what an ensemble combines (and how the answer was decided)
_DECIDED_COLUMNS = ["gold", "pred", "decision", "decision_scores", "tcb_basis"]


class Evaluator:
    """Scores a prompt on the test items and stresses it, once per distinct prompt (and once per compare:
    finished evaluations are kept in the store and reused by a resumed compare)."""

    def __init__(
        self,
        session,
        test,
        suite,
        robust_limit,
        similarity,
        progress,
        store: EvaluationStore,
        *,
        search_suite=None,
        seen=frozenset(),
        dev=(),
    ):
        self.session, self.test, self.suite, self.similarity, self.progress = session, test, suite, similarity, progress
        self.search_suite, self.seen = search_suite, seen
        self.robust_items = test[:robust_limit]
        self.robust_limit = robust_limit
        self.store = store
        self.dev = list(dev)  # what decision rules are fit on
        self._done: dict[str, Evaluated] = {}
        self.evaluations = self.reused = self.resumed = 0

    def __call__(self, prompt) -> Evaluated:
        key = self.store.key(prompt, "test")
        if key in self._done:
            self.reused += 1
            return self._done[key]
        self.evaluations += 1
        evaluated = self.store.load(key)
        if evaluated is not None:
            self.resumed += 1
        else:
            fault_point("compare-test")
            scorer, rule = self.scorer_for(prompt)
            table = scorer.score(prompt, self.test).table
            evaluated = Evaluated(table[_TEST_COLUMNS + [c for c in _DECIDED_COLUMNS if c in table]])
            evaluated.rule = None if rule is None else rule.to_card()
            if self.suite is not None:
                fault_point("compare-robust")
                evaluated.robust, evaluated.clean, evaluated.variants, evaluated.items = self._stress(
                    prompt, self.robust_items, self.suite, seen=self.seen, taboo=True, scorer=scorer
                )
            self.store.save(key, evaluated)
        self._done[key] = evaluated
        return evaluated

    def scorer_for(self, prompt):
        """(the scorer that answers for `prompt`, its fitted decision rule), the rule fit on the compare's dev items."""
        from promptopt.scoring.calibration import deciding_scorer

        return deciding_scorer(self.session.scorer, prompt, self.dev)

    @property
    def search_suite_name(self) -> str | None:
        return self.search_suite.name if self.search_suite else None

    def robustness(self, prompt, items):
        """(summary, clean, variants) of a prompt stressed on `items` under the search suite (`select="robust"`: dev
        items; the judging suite's families stay unseen), kept in the store."""
        key = self.store.key(prompt, f"robustness:{items_sha256(items)}")
        stored = self.store.load(key)
        if stored is None:
            stored = Evaluated(None)
            scorer, _ = self.scorer_for(prompt)
            stored.robust, stored.clean, stored.variants, _ = self._stress(
                prompt, items, self.search_suite, scorer=scorer
            )
            self.store.save(key, stored)
        return stored.robust, stored.clean, stored.variants

    def _stress(self, prompt, items, suite, *, seen=None, taboo: bool = False, scorer=None):
        from promptopt.robustness import taboo_stress
        from promptopt.robustness.suite import evaluate_robustness

        scorer, data = scorer or self.session.scorer, self.session.data
        rob = evaluate_robustness(
            scorer,
            prompt,
            items,
            suite,
            pool=data.pool,
            similarity=self.similarity,
            paraphrases=self.session.paraphrases,
            seen=seen,
            progress=self.progress,
            desc=f"robustness {prompt.task}",
        )
        summary = dict(rob.summary)
        summary["taboo_retention_i1"] = math.nan  # log-likelihood tasks generate nothing to stress
        if taboo and data.spec.generative:
            stress = taboo_stress(scorer, prompt, items, ranks=(1,)).summary.set_index("rank")
            summary["taboo_retention_i1"] = stress.loc[1, "retention"]
        clean = (
            rob.items.loc[rob.items["family"].isna()]
            .set_index("item_id")["clean_correct"]
            .astype(bool)
            .rename("correct")
        )
        variants = rob.variants if len(rob.variants) else pd.DataFrame(columns=["item_id", "family", "correct"])
        if seen is not None:
            variants = variants.assign(seen=variants["family"].isin(set(seen)).astype(bool))
        return (
            summary,
            clean,
            variants[["item_id", "family", "correct", *(["seen"] if seen is not None else [])]],
            rob.items,
        )
