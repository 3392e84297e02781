"""`promptopt compare`: do δ_TCB-guided prompts hold up better than PPL-guided ones on this task and model?

Every strategy searches with the same budget, dev and test items; with `seeds` > 1 each is searched
several times (sampler seed and exemplar-candidate draw vary per seed). For each search the top-N
distinct trials are scored on the same held-out test items and stressed (perturbation suite, and taboo
retention at i = 1 for generative tasks); a prompt two searches share is evaluated once. The winner of a
search is the strategy's own choice (`select="strategy"`) or, with `select="robust"`, the trial with the
best Acc_worst on dev items under the search suite among those whose dev accuracy is inside the best one's
95% interval.

Seen and unseen: `search_suite` (default `cheap`) holds the families a search may look at (the `robust`
strategy trains on them, `select="robust"` reads them on dev items); `suite` (default `unseen`) the families
the winners are judged on. A judged family with the name or the operator of a search-suite family is
*seen*, any other *unseen* (`promptopt.robustness.suite.seen_families`), and every robustness number comes
three ways: over all judged families (`acc_worst`, `pdr`, ... as before), over the unseen ones
(`acc_worst_unseen`, ...) and over the seen ones (`acc_worst_seen`, ...; NaN when none is judged). Every
answer goes to `robustness_items.parquet` (one row per strategy, seed, item, family and variant of the
winners, and one clean row per item: family null), from which every robustness number can be recomputed;
every winner's test answers go to `test_items.parquet` (one row per strategy, seed and item).

Then: per strategy mean ± sd over seeds, and for every pair of strategies (and each against the task's
default prompt) the paired difference on the same test items — accuracy, Acc_worst, PDR — with a seeded
95% paired-bootstrap interval and an exact McNemar p-value on per-item correctness (pairs are the same
seed of both strategies; items of all seeds are pooled).

One session: the model is loaded once, one result cache serves every study, all studies live in one
storage (`study.db` in the run directory by default).

A compare is one resumable unit: `resume=True` continues whatever exists (finished studies reused, a killed
one resumed, missing ones created) and reuses every finished evaluation (`evaluations/` in the run
directory), so a compare killed anywhere ends with the tables the uninterrupted run writes. Whether each
study may be resumed or created is decided before anything is scored.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.card import sha256_json
from promptopt.errors import ConfigError, UserError
from promptopt.experiments.session import Session
from promptopt.metrics.stats import (
    PerItemRobustness,
    bootstrap_resamples,
    mcnemar_exact,
    percentile_interval,
    wilson_interval,
)
from promptopt.search import SearchConfig, get_strategy, run_search, study_exists
from promptopt.search.config import default_storage_url, redact
from promptopt.search.recovery import fault_point
from promptopt.tasks.item import items_sha256
from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text, check_output, remove_empty_dirs, write_table

SELECTIONS = ("strategy", "robust")
ITEMS_FILE = "robustness_items.parquet"
TEST_ITEMS_FILE = "test_items.parquet"  # every winner's test answers: what `pair` pairs, whichever trial won
SPLITS = ("unseen", "seen")
_N_BOOT = 2000
# per prompt: over all judged families, then (suffix _unseen / _seen) over each split alone
_ROBUST_KEYS = ("acc_var_pert", "pdr", "pdr_pooled", "acc_worst", "acc_worst_family_min", "acc_worst_family")
_SPLIT_MEANS = ("acc_var_pert", "pdr", "pdr_pooled", "acc_worst", "acc_worst_family_min")
_PAIRED_KEYS = ("acc_worst", "pdr")


@dataclass
class Evaluated:
    """One prompt evaluated on the test items (and, with a suite, under perturbation)."""

    test: pd.DataFrame  # per-item test table
    robust: dict = field(default_factory=dict)  # robustness summary (+ taboo) on the robustness items
    clean: pd.Series | None = None  # item_id -> correct, robustness items
    variants: pd.DataFrame | None = None  # item_id, family, correct (and seen, where the families were labelled)
    items: pd.DataFrame | None = None  # every answer, clean and perturbed (robustness.suite.ITEM_COLUMNS)


@dataclass
class CompareResult:
    table: pd.DataFrame  # one row per strategy (mean over seeds) and the baseline
    runs: pd.DataFrame  # one row per (strategy, seed, rank): every evaluated candidate
    paired: pd.DataFrame  # one row per pair of strategies
    summary: dict
    proposals: object = None  # what --propose added to the space (experiments.propose.Proposals), else None


def run_compare(
    base: SearchConfig,
    strategies: list[str],
    *,
    seeds: int = 1,
    top_n: int = 3,
    select: str = "strategy",
    suite: str | None = "unseen",
    search_suite: str | None = "cheap",
    robust_limit: int | None = None,
    show_progress: bool = True,
    propose=None,
) -> CompareResult:
    """Search every strategy `seeds` times, evaluate each search's top-N prompts, compare the winners.
    `search_suite`: what searches may look at; `suite`: what the winners are judged on (None: no robustness).
    `propose`: an experiments.propose.ProposeRequest; its proposals join the space (`<out>/space.yaml`) before
    any study, so every strategy and seed searches the same grown space."""
    from promptopt.robustness.suite import load_suite

    for name in strategies:
        get_strategy(name)  # fail on a typo before anything runs
    if len(set(strategies)) != len(strategies) or not strategies:
        raise ConfigError(f"strategies: expected distinct names, got {strategies}")
    if seeds < 1 or top_n < 1:
        raise ConfigError(f"seeds and top_n must be positive, got seeds={seeds}, top_n={top_n}")
    if select not in SELECTIONS:
        raise ConfigError(f"select: expected one of {', '.join(SELECTIONS)}, got {select!r}")
    if select == "robust" and not search_suite:
        raise ConfigError("select='robust' reads dev robustness under the search suite: give a search suite")
    if not search_suite and any(get_strategy(name).needs_variants for name in strategies):
        raise ConfigError(
            f"strategies {', '.join(strategies)}: the robust strategy trains on the search suite: give a search suite"
        )
    the_suite = load_suite(suite) if suite else None
    the_search_suite = load_suite(search_suite) if search_suite else None
    out = Path(base.out)
    check_output(out, folder=True, what="--out")
    made_out = not out.exists()
    try:
        return _compare(
            base,
            strategies,
            out,
            seeds=seeds,
            top_n=top_n,
            select=select,
            the_suite=the_suite,
            search_suite=the_search_suite,
            search_suite_spec=search_suite,
            robust_limit=robust_limit,
            show_progress=show_progress,
            propose=propose,
        )
    except Exception:  # folders this compare created and left empty go too (finished work stays for --resume)
        if made_out:
            remove_empty_dirs([out, *(p for p in out.rglob("*") if p.is_dir())])
        raise


def _compare(
    base: SearchConfig,
    strategies: list[str],
    out: Path,
    *,
    seeds: int,
    top_n: int,
    select: str,
    the_suite,
    search_suite,
    search_suite_spec: str | None,
    robust_limit: int | None,
    show_progress: bool,
    propose=None,
) -> CompareResult:
    from promptopt.robustness.suite import Similarity, seen_families, suite_sha256

    storage = base.study.storage or default_storage_url(out)
    session = Session(model=base.model, data=base.data, out=out, batch_size=base.batch_size)
    proposals, pending = None, None
    if propose is not None:  # before the plan: every study's identity hashes the grown space
        from promptopt.experiments.propose.rounds import PENDING, PROPOSALS_DIR
        from promptopt.experiments.propose.workflow import propose_space

        if propose.mode == "history":
            raise ConfigError(
                "compare --propose-mode history: history proposals come from search rounds (search --rounds)"
            )
        out.mkdir(parents=True, exist_ok=True)
        proposed = propose_space(
            session, propose, space=base.study.space, out=out / PENDING, cache_dir=out / PROPOSALS_DIR
        )
        base, proposals, pending = base.replace(space=str(proposed.path)), proposed.proposals, proposed.path
    configs = {(name, s): _seed_config(base, name, s, seeds, out, storage) for name in strategies for s in range(seeds)}
    expand = None
    if any(get_strategy(name).needs_variants for name in strategies):
        from promptopt.robustness import VariantExpander

        expand = VariantExpander(search_suite_spec)
    try:
        # the compare's own record of the suite its robust studies trained on speaks first (it names the suite to
        # resume with); then every study is checked (a resumed one's identity hashes that suite as well)
        marker = _search_suite_marker(out, search_suite, resume=base.study.resume) if expand is not None else None
        configs = _plan(configs, session.data, expand, out, resume=base.study.resume)  # before anything is scored
    except BaseException:
        if pending is not None:
            pending.unlink(missing_ok=True)  # refused: the space file of the earlier run stays as it was
        raise
    if pending is not None:  # the plan holds with the proposed space: put it in place, under its final name
        final = out / "space.yaml"
        os.replace(pending, final)
        configs = {key: config.replace(space=str(final)) for key, config in configs.items()}
    test, dev = session.items("test"), session.items("dev")
    search_digest = suite_sha256(search_suite) if search_suite else None
    store = _Store(
        out / "evaluations",
        {
            "model": base.model.spec,
            "dtype": base.model.resolved_dtype(),
            "quantize": base.model.quantize,
            "test": items_sha256(test),
            "robust_limit": robust_limit,
            "suite": suite_sha256(the_suite) if the_suite else None,
            "search_suite": search_digest,
        },
    )
    seen = seen_families(the_suite, search_suite) if the_suite else frozenset()
    evaluator = _Evaluator(
        session,
        test,
        the_suite,
        robust_limit,
        Similarity() if the_suite or search_suite else None,
        show_progress,
        store,
        search_suite=search_suite,
        seen=seen,
    )

    start = time.perf_counter()
    baseline_prompt = session.data.default_prompt()
    baseline = evaluator(baseline_prompt)
    runs = [
        _run_row(
            "baseline",
            0,
            0,
            baseline,
            winner=True,
            how="the task's default prompt",
            extra={"card": "task default prompt"},
        )
    ]
    winners: dict[str, list[Evaluated]] = {"baseline": [baseline] * seeds}
    baseline_wall = time.perf_counter() - start
    walls: dict[str, float] = {"baseline": baseline_wall}
    if marker is not None:  # written where the robust studies are about to be: they were searched under it
        atomic_write_text(out / _SEARCH_SUITE_FILE, json.dumps(marker, indent=1))
    for (name, s), config in configs.items():
        fault_point("compare-search")
        result = run_search(config, scorer=session.scorer, expand=expand, show_progress=show_progress)
        walls[name] = walls.get(name, 0.0) + result.wall_seconds
        ranked = result.ranking[:top_n] or [
            {
                "number": result.best_number,
                "prompt": result.prompt,
                "accuracy": result.dev["accuracy"],
                "n": result.dev["n"],
            }
        ]
        chosen, how = _choose(select, ranked, result, evaluator, dev)
        for rank, entry in enumerate(ranked):
            evaluated = evaluator(entry["prompt"])
            is_winner = entry["number"] == chosen["number"]
            runs.append(
                _run_row(
                    name,
                    s,
                    rank,
                    evaluated,
                    winner=is_winner,
                    how=how if is_winner else "",
                    extra={
                        "trial": entry["number"],
                        "dev_accuracy": entry.get("accuracy"),
                        "card": str(result.card_path) if entry["number"] == result.best_number else "",
                    },
                )
            )
            if is_winner:
                winners.setdefault(name, []).append(evaluated)
    runs_table = pd.DataFrame(runs)
    table = _strategy_table(runs_table, winners, walls, seed=base.study.seed)
    paired = _paired_table(winners, seed=base.study.seed)
    families = [f.name for f in the_suite.families] if the_suite else []
    summary = {
        "task": session.data.spec.name,
        "model": base.model.spec,
        "strategies": strategies,
        "seeds": seeds,
        "top_n": top_n,
        "select": select,
        "suite": the_suite.name if the_suite else None,
        "search_suite": search_suite.name if search_suite else None,
        "families_seen": [f for f in families if f in seen],
        "families_unseen": [f for f in families if f not in seen],
        "seen_rule": "a judged family is seen when the search suite has a family of the same name or operator",
        "n_test": len(test),
        "n_robust": len(test[:robust_limit]) if the_suite else 0,
        "evaluations": evaluator.evaluations,
        "evaluations_reused": evaluator.reused,
        "evaluations_resumed": evaluator.resumed,
        "studies_resumed": [c.name for c in configs.values() if c.study.resume],
        "result_cache_hit_rate": session.scorer.cache.hit_rate,
        "result_cache_hits": session.scorer.cache.hits,
        "result_cache_misses": session.scorer.cache.misses,
        "variant_embedding_hit_rate": evaluator.similarity.hit_rate if evaluator.similarity else None,
        "paraphrase_memo_hits": session.paraphrases.hits,
        "paraphrase_memo_misses": session.paraphrases.misses,
        "table": json.loads(table.to_json(orient="records")),
        "paired": json.loads(paired.to_json(orient="records")),
    }
    if proposals is not None:
        summary["proposals"] = {
            "space": str(out / "space.yaml"),
            "accepted": len(proposals.accepted),
            "drops": proposals.drops,
            "attempts": proposals.attempts,
            "reused": proposals.reused,
        }
    _write(out, table, runs_table, paired, summary, _items(winners), _test_items(winners))
    return CompareResult(table, runs_table, paired, summary, proposals)


_SEARCH_SUITE_FILE = "search_suite.json"


def _search_suite_marker(out: Path, search_suite, *, resume: bool) -> dict:
    """A `robust` study does not record the suite it trained on, so the compare does (search_suite.json): a
    resumed compare must search with the suite it started with. Checked before anything is scored."""
    from promptopt.robustness.suite import suite_sha256

    mine = {"name": search_suite.name, "sha256": suite_sha256(search_suite)}
    path = out / _SEARCH_SUITE_FILE
    if resume and path.is_file():
        theirs = json.loads(path.read_text(encoding="utf-8"))
        if theirs.get("sha256") != mine["sha256"]:
            raise UserError(
                f"compare in {out} searched the robust strategy under --search-suite {theirs.get('name')} with other "
                f"content (sha256 {str(theirs.get('sha256'))[:12]}, this one's {mine['sha256'][:12]}; before "
                f"promptopt hashed a suite's content alone it hashed its file's path too): resume it with the suite "
                f"it started with, or choose another --out"
            )
    return mine


def _winner_rows(winners: dict, table_of) -> pd.DataFrame | None:
    """One table of every winner's rows (`table_of(evaluation)`), strategy and seed first; the baseline once (seed 0)."""
    tables = [
        (name, s, table_of(ev))
        for name, evaluations in winners.items()
        for s, ev in enumerate(evaluations[:1] if name == "baseline" else evaluations)
    ]
    parts = [table.assign(strategy=name, seed=s) for name, s, table in tables if table is not None]
    if not parts:
        return None
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "seed", *[c for c in table.columns if c not in ("strategy", "seed")]]]


def _items(winners: dict) -> pd.DataFrame | None:
    """Every winner's answers, one row per (strategy, seed, item, family, variant)."""
    return _winner_rows(winners, lambda ev: ev.items)


def _test_items(winners: dict) -> pd.DataFrame | None:
    """Every winner's test answers, one row per (strategy, seed, item). With `select="robust"` a winner need not
    be its search's best trial, whose table is the run directory's."""
    return _winner_rows(winners, lambda ev: ev.test)


def _seed_config(base: SearchConfig, name: str, s: int, seeds: int, out: Path, storage: str) -> SearchConfig:
    """Seed 0 is the plain run (same study name, sampler seed and candidates as a one-seed compare);
    later seeds shift the sampler seed and draw other exemplar candidates from the pool."""
    if seeds == 1:
        return base.replace(strategy=name, out=str(out / name), storage=storage, study_name=None)
    task = Path(base.data.task).stem
    return base.replace(
        strategy=name,
        out=str(out / name / f"seed{s}"),
        storage=storage,
        study_name=f"{task}-{name}-seed{s}",
        seed=base.study.seed + 7919 * s,
        pool_draw=None if s == 0 else base.study.seed + s,
    )


def _plan(configs: dict, data, expand, out: Path, *, resume: bool) -> dict:
    """Each study's config with `resume` set to whether it exists, after checking every study (space,
    strategy, and for an existing one that it means the same thing). Without `resume`, a compare that has
    started in `out` (a study or an evaluation exists) is refused: nothing is scored before this."""
    exists = {key: study_exists(config, data, expand) for key, config in configs.items()}
    started = [configs[key].name for key, found in exists.items() if found]
    if not resume and (started or _Store.any_in(out / "evaluations")):
        what = (
            f"study '{started[0]}' exists in {redact(next(iter(configs.values())).storage_url)}"
            if started
            else f"{out / 'evaluations'} exists"
        )
        raise UserError(
            f"compare in {out} has already started ({what}): pass --resume to continue it, or choose another --out"
        )
    return {key: config.replace(resume=exists[key]) for key, config in configs.items()}


class _Store:
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
        evaluated = Evaluated(pd.read_parquet(folder / "test.parquet") if done["test"] else None, robust=done["robust"])
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
        }
        atomic_write_text(folder / "done.json", json.dumps(done, indent=1))


_TEST_COLUMNS = ["item_id", "correct", "tcb", "ppl"]  # what the tables read of a prompt's test items


class _Evaluator:
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
        store: _Store,
        *,
        search_suite=None,
        seen=frozenset(),
    ):
        self.session, self.test, self.suite, self.similarity, self.progress = session, test, suite, similarity, progress
        self.search_suite, self.seen = search_suite, seen
        self.robust_items = test[:robust_limit]
        self.robust_limit = robust_limit
        self.store = store
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
            evaluated = Evaluated(self.session.scorer.score(prompt, self.test).table[_TEST_COLUMNS])
            if self.suite is not None:
                fault_point("compare-robust")
                evaluated.robust, evaluated.clean, evaluated.variants, evaluated.items = self._stress(
                    prompt, self.robust_items, self.suite, seen=self.seen, taboo=True
                )
            self.store.save(key, evaluated)
        self._done[key] = evaluated
        return evaluated

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
            stored.robust, stored.clean, stored.variants, _ = self._stress(prompt, items, self.search_suite)
            self.store.save(key, stored)
        return stored.robust, stored.clean, stored.variants

    def _stress(self, prompt, items, suite, *, seen=None, taboo: bool = False):
        from promptopt.robustness import taboo_stress
        from promptopt.robustness.suite import evaluate_robustness

        scorer, data = self.session.scorer, self.session.data
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


def _choose(select, ranked, result, evaluator, dev):
    if select == "strategy":
        return ranked[0], result.selection
    best = max(ranked, key=lambda e: (e["accuracy"], -e["number"]))
    low, _ = wilson_interval(round(best["accuracy"] * best["n"]), best["n"])
    eligible = [e for e in ranked if e["accuracy"] >= low]
    scored = []
    for entry in eligible:  # robustness measured on dev items: the test items stay held out
        summary, _, _ = evaluator.robustness(entry["prompt"], dev[: evaluator.robust_limit])
        scored.append((summary["acc_worst"], entry["accuracy"], -entry["number"], entry))
    acc_worst, _, _, chosen = max(scored, key=lambda x: x[:3])
    under = getattr(evaluator, "search_suite_name", None)
    return chosen, (
        f"best dev Acc_worst ({acc_worst:.3f}{f', search suite {under}' if under else ''}) among {len(eligible)} of the top {len(ranked)} trials whose dev "
        f"accuracy is inside the best one's 95% interval (≥ {low:.3f})"
    )


def _run_row(strategy, seed, rank, ev: Evaluated, *, winner, how, extra) -> dict:
    t = ev.test
    n, k = len(t), int(t["correct"].sum())
    low, high = wilson_interval(k, n)
    tcb = t["tcb"].replace([np.inf], np.nan)
    row = {
        "strategy": strategy,
        "seed": seed,
        "rank": rank,
        "winner": winner,
        "n_test": n,
        "avg_acc": k / n,
        "acc_ci_low": low,
        "acc_ci_high": high,
        "avg_tcb": float(tcb.mean()),
        "tcb_geomean": float(np.exp(np.log(tcb.dropna()).mean())),
        "avg_ppl": float(t["ppl"].mean()),
        "selected_by": how,
    }
    r = ev.robust
    for key in (
        "acc_var_pert",
        "acc_var_families",
        "pdr",
        "pdr_pooled",
        "acc_worst",
        "acc_worst_family_min",
        "acc_worst_family",
        "tcb_perturbed_mean",
        "taboo_retention_i1",
    ):
        row[key] = r.get(key, math.nan)
    for key in ("acc_worst", "pdr", "acc_var_pert"):
        ci = r.get(f"{key}_ci95", [math.nan, math.nan])
        row[f"{key}_ci_low"], row[f"{key}_ci_high"] = ci
    for split in SPLITS:  # the same numbers over the unseen families alone, and over the seen ones
        for key in _ROBUST_KEYS:
            value = r.get(f"{key}_{split}")
            row[f"{key}_{split}"] = math.nan if value is None else value
        for key in _PAIRED_KEYS:
            row[f"{key}_{split}_ci_low"], row[f"{key}_{split}_ci_high"] = r.get(f"{key}_{split}_ci95") or [
                math.nan,
                math.nan,
            ]
    row.update(extra)
    return row


def _strategy_table(runs: pd.DataFrame, winners: dict, walls: dict, *, seed: int = 0) -> pd.DataFrame:
    """Per strategy: the winners' numbers, mean over seeds (± sd across seeds when there are several), with
    intervals: one search's own, or over several the pooled ones (`_pooled_acc_worst_intervals`)."""
    rows = []
    chosen = runs[runs["winner"]]
    for name, group in chosen.groupby("strategy", sort=False):
        row = {
            "strategy": name,
            "n_seeds": len(winners[name]) if name != "baseline" else 1,
            "n_test": int(group["n_test"].iloc[0]),
        }
        for key in (
            "avg_acc",
            "avg_tcb",
            "tcb_geomean",
            "avg_ppl",
            "acc_var_pert",
            "pdr",
            "pdr_pooled",
            "acc_worst",
            "acc_worst_family_min",
            "taboo_retention_i1",
            *(f"{k}_{split}" for split in SPLITS for k in _SPLIT_MEANS),
        ):
            values = group[key].astype(float)
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else math.nan
        if len(group) == 1:  # one search: its own intervals
            for key in (
                "acc_ci_low",
                "acc_ci_high",
                "acc_worst_ci_low",
                "acc_worst_ci_high",
                "pdr_ci_low",
                "pdr_ci_high",
                *(f"{k}_{split}_ci_{end}" for split in SPLITS for k in _PAIRED_KEYS for end in ("low", "high")),
            ):
                row[key] = group[key].iloc[0]
        else:  # several: the pooled Wilson interval of accuracy over seeds × items
            k = float((group["avg_acc"] * group["n_test"]).sum())
            row["acc_ci_low"], row["acc_ci_high"] = wilson_interval(round(k), int(group["n_test"].sum()))
            row.update(_pooled_acc_worst_intervals(winners[name], seed=seed))
        for key in ("acc_worst_family", *(f"acc_worst_family_{split}" for split in SPLITS)):
            row[key] = group[key].iloc[0]
        row["selected_by"] = group["selected_by"].iloc[0]
        row["wall_seconds"] = walls.get(name, math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def _pooled_acc_worst_intervals(evaluations: list[Evaluated], *, seed: int) -> dict:
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
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = (
            percentile_interval(pooled.resampled_metrics(resamples)["acc_worst"]) if n_items else (math.nan, math.nan)
        )
    return out


def _paired_table(winners: dict, *, seed: int) -> pd.DataFrame:
    """Every pair of strategies on the same test items: Δ accuracy, Δ Acc_worst, Δ PDR (first − second); the
    robustness deltas over all judged families, and where families are labelled over the unseen ones alone
    (`delta_acc_worst_unseen`: the headline) and the seen ones alone (NaN when the split has no family).

    With several seeds the pairs are (seed, item), but the seeds of one item are not independent samples: the
    bootstrap resamples items, each with all its seeds (`cluster_resamples`), so repeating a search does not narrow
    an interval by itself. The exact McNemar p-value counts discordant (seed, item) pairs as independent; a
    difference is starred only when that p < 0.05 and the clustered interval excludes 0."""
    rows = []
    for a, b in combinations(list(winners), 2):
        row = {"a": a, "b": b}
        acc_a = np.concatenate([ev.test["correct"].to_numpy(dtype=bool) for ev in winners[a]])
        acc_b = np.concatenate([ev.test["correct"].to_numpy(dtype=bool) for ev in winners[b]])
        n_seeds = len(winners[a])
        n_items = len(acc_a) // n_seeds
        row["n_pairs"] = len(acc_a)
        row["delta_acc"] = float(acc_a.mean() - acc_b.mean())
        resamples = cluster_resamples(n_items, n_seeds, n_boot=_N_BOOT, seed=seed)
        row["delta_acc_ci_low"], row["delta_acc_ci_high"] = (
            percentile_interval(acc_a[resamples].mean(-1) - acc_b[resamples].mean(-1))
            if n_items
            else (math.nan, math.nan)
        )
        row["only_a_correct"], row["only_b_correct"], row["mcnemar_p"] = mcnemar_exact(acc_a, acc_b)
        if winners[a][0].clean is not None:
            labelled = all("seen" in ev.variants for ev in (*winners[a], *winners[b]))
            for split in (None, *(SPLITS if labelled else ())):
                suffix = f"_{split}" if split else ""
                if split and not _has_families(winners[a], split):
                    for key in _PAIRED_KEYS:
                        name = f"delta_{key}{suffix}"
                        row[name] = row[f"{name}_ci_low"] = row[f"{name}_ci_high"] = math.nan
                    continue
                pa, pb = _pooled(winners[a], split), _pooled(winners[b], split)
                n_robust = len(pa.items) // n_seeds
                whole_a, whole_b = pa.metrics(), pb.metrics()
                resamples = cluster_resamples(n_robust, n_seeds, n_boot=_N_BOOT // 4, seed=seed)
                each_a, each_b = (
                    pa.resampled_metrics(resamples),
                    pb.resampled_metrics(resamples),
                )  # on the same resamples
                for key in _PAIRED_KEYS:
                    name = f"delta_{key}{suffix}"
                    row[name] = float(whole_a[key] - whole_b[key])
                    row[f"{name}_ci_low"], row[f"{name}_ci_high"] = (
                        percentile_interval(each_a[key] - each_b[key]) if n_robust else (math.nan, math.nan)
                    )
        row["significant"] = bool(
            row["mcnemar_p"] < 0.05 and not (row["delta_acc_ci_low"] <= 0 <= row["delta_acc_ci_high"])
        )
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


def _write(
    out: Path, table, runs, paired, summary, items: pd.DataFrame | None = None, test_items: pd.DataFrame | None = None
) -> None:
    atomic_write_bytes_via(out / "compare.csv", lambda p: table.to_csv(p, index=False))
    atomic_write_bytes_via(out / "compare.parquet", lambda p: table.to_parquet(p, index=False))
    atomic_write_bytes_via(out / "compare_runs.csv", lambda p: runs.to_csv(p, index=False))
    atomic_write_bytes_via(out / "compare_paired.csv", lambda p: paired.to_csv(p, index=False))
    if items is not None:
        write_table(items, out / ITEMS_FILE)
    if test_items is not None:
        write_table(test_items, out / TEST_ITEMS_FILE)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
