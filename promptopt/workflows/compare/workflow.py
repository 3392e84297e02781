"""`run_compare`, stage by stage: validate, plan every study (`_plan`), the evaluator whose store `--resume` reuses
(`evaluation_resume_key`), evaluate the baseline, run each search and evaluate its top-N trials and its winner
(`_searches`), build the tables, write them (see the package docstring for what it measures)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.errors import ConfigError
from promptopt.metrics.stats.selection import encode_answers
from promptopt.study import SearchConfig, get_strategy, run_search
from promptopt.study.config import default_storage_url
from promptopt.study.recovery import fault_point
from promptopt.tasks.item import items_sha256
from promptopt.workflows.compare.choose import WINNER_SELECTIONS, choose_winner
from promptopt.workflows.compare.ensembles import build_ensembles
from promptopt.workflows.compare.entries import ENSEMBLE_SUFFIX, ensemble_name
from promptopt.workflows.compare.evaluate import EvaluationStore, Evaluator
from promptopt.workflows.compare.paired import paired_table
from promptopt.workflows.compare.plan import SEARCH_SUITE_FILE, plan_studies, search_suite_marker, seed_config
from promptopt.workflows.compare.tables import run_record, strategy_table
from promptopt.workflows.compare.write import winner_robustness_answers, winner_test_answers, write_outputs
from promptopt.workflows.session import Session
from promptopt.yamlio import atomic_write_text, check_output, remove_empty_dirs, remove_orphaned_temporaries

_CHOICE_KEYS = ("n_dev_items", "n_candidates", "tie_break", "mde", "discordance", "winner", "best")


@dataclass
class CompareResult:
    table: pd.DataFrame  # one row per strategy (mean over seeds) and the baseline
    runs: pd.DataFrame  # one row per (strategy, seed, rank): every evaluated candidate
    paired: pd.DataFrame  # one row per pair of strategies
    summary: dict
    proposals: object = None  # what --propose added to the space (workflows.propose.Proposals), else None
    storage_url: str | None = None  # where every study of the compare lives
    out: Path | None = None  # the run directory

    def studies(self) -> dict:
        """Every Optuna study of the compare, by name (one per strategy and seed)."""
        import optuna

        names = optuna.get_all_study_names(storage=self.storage_url)
        return {name: optuna.load_study(study_name=name, storage=self.storage_url) for name in names}


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
    ensembles: tuple[int, ...] = (),
    ensemble_of: list[str] | None = None,
    ensemble_objective: str = "accuracy",
) -> CompareResult:
    """Search every strategy `seeds` times, evaluate each search's top-N prompts, compare the winners.
    `strategies`: entries `strategy` or `strategy@rule` (every trial decides by the rule, promptopt/decision.py).
    `search_suite`: what searches may look at; `suite`: what the winners are judged on (None: no robustness).
    `propose`: an workflows.propose.ProposeRequest; its proposals join the space (`<out>/space.yaml`) before
    any study, so every strategy and seed searches the same grown space. `ensembles` (K, ...): per seed of each
    entry of `ensemble_of` (default: every entry), a K-member ensemble of its search's trials chosen on dev
    (workflows/ensemble.py), evaluated as `<entry>+ens<K>` beside the winners."""
    from promptopt.robustness.suite import load_suite
    from promptopt.workflows.compare.entries import parse_entries
    from promptopt.workflows.ensemble import objective_of

    entries = parse_entries(strategies)  # a typo in a strategy or a rule fails before anything runs
    unknown = sorted(set(ensemble_of or []) - {e.name for e in entries})
    if unknown:
        raise ConfigError(
            f"--ensemble-of: {unknown[0]} is not one of the compared strategies ({', '.join(strategies)})"
        )
    if any(k < 2 for k in ensembles):
        raise ConfigError(f"--ensembles: an ensemble has at least 2 members, got {list(ensembles)}")
    objective_of(ensemble_objective)
    if seeds < 1 or top_n < 1:
        raise ConfigError(f"seeds and top_n must be positive, got seeds={seeds}, top_n={top_n}")
    if select not in WINNER_SELECTIONS:
        raise ConfigError(f"select: expected one of {', '.join(WINNER_SELECTIONS)}, got {select!r}")
    if select == "robust" and not search_suite:
        raise ConfigError("select='robust' reads dev robustness under the search suite: give a search suite")
    if not search_suite and any(get_strategy(e.strategy).needs_variants for e in entries):
        raise ConfigError(
            f"strategies {', '.join(strategies)}: the robust strategy trains on the search suite: give a search suite"
        )
    out = Path(base.out)
    check_output(out, folder=True, what="--out")
    made_out = not out.exists()
    options = _Options(
        seeds=seeds,
        top_n=top_n,
        select=select,
        suite=load_suite(suite) if suite else None,
        search_suite=load_suite(search_suite) if search_suite else None,
        search_suite_spec=search_suite,
        robust_limit=robust_limit,
        show_progress=show_progress,
        propose=propose,
        ensembles=tuple(ensembles),
        ensemble_of=list(ensemble_of) if ensemble_of else [e.name for e in entries],
        ensemble_objective=ensemble_objective,
    )
    out = Path(base.out)
    check_output(out, folder=True, what="--out")
    made_out = not out.exists()
    try:
        return _compare(base, entries, out, options)
    except Exception:  # folders this compare created and left empty go too (finished work stays for --resume)
        if made_out:
            remove_empty_dirs([out, *(p for p in out.rglob("*") if p.is_dir())])
        raise


@dataclass(frozen=True)
class _Options:
    """run_compare's arguments, checked (suites loaded)."""

    seeds: int
    top_n: int
    select: str
    suite: object  # the judging suite (robustness.suite.Suite), or None
    search_suite: object  # what searches may look at, or None
    search_suite_spec: str | None  # its name or path, as given
    robust_limit: int | None
    show_progress: bool
    propose: object
    ensembles: tuple[int, ...]
    ensemble_of: list[str]
    ensemble_objective: str


@dataclass
class _Plan:
    """What the compare decided before anything is scored: the session, every study's config (resume or create),
    the variant expander of the robust studies and the record of their search suite, what --propose added."""

    base: SearchConfig
    session: Session
    configs: dict  # (entry name, seed) -> its study's config
    expand: object  # robustness.VariantExpander where a strategy trains on variants, else None
    marker: dict | None  # search_suite.json's content, written when the robust studies are about to run
    proposals: object = None
    test: list = field(default_factory=list)
    dev: list = field(default_factory=list)


@dataclass
class _Searched:
    """What the searches gave: every candidate's row, each entry's winners (one per seed), the searches' wall
    times and their dev choices."""

    runs: list = field(default_factory=list)  # RunRow per evaluated candidate
    winners: dict = field(default_factory=dict)  # entry -> [Evaluated] per seed
    walls: dict = field(default_factory=dict)
    choices: list = field(default_factory=list)  # each search's dev choice: tie set size, tie-break, the MDE
    baseline_seconds: float = 0.0


def _compare(base: SearchConfig, entries: list, out: Path, options: _Options) -> CompareResult:
    """The stages, in order: plan, the evaluator (its resume key), the baseline, the searches, the tables, the files."""
    plan = _plan(base, entries, out, options)
    evaluator = _evaluator(plan, out, options)
    searched = _baseline(plan, evaluator, options)
    _searches(plan, evaluator, options, searched, out)
    short = left_out_ensembles(searched.winners, options.seeds)
    for name, why in short.items():  # pairs are (seed, item): an entry missing a seed pairs with nothing
        del searched.winners[name]
        searched.runs = [r for r in searched.runs if r.strategy != name]
        print(f"note: {name} left out of the tables: {why}", file=sys.stderr, flush=True)  # a result: even --quiet
    runs_table = pd.DataFrame([r.columns() for r in searched.runs])
    table = strategy_table(runs_table, searched.winners, searched.walls, seed=plan.base.study.seed)
    paired = paired_table(searched.winners, seed=plan.base.study.seed)
    summary = _summary(plan, entries, evaluator, options, searched, table, paired, short, out)
    winners = searched.winners
    write_outputs(
        out, table, runs_table, paired, summary, winner_robustness_answers(winners), winner_test_answers(winners)
    )
    return CompareResult(table, runs_table, paired, summary, plan.proposals, plan.base.storage_url, Path(plan.base.out))


def _plan(base: SearchConfig, entries: list, out: Path, options: _Options) -> _Plan:
    """Every study's config, whether each may be resumed or created, checked before anything is scored; the
    proposed space (--propose) put in place once the plan holds."""
    storage = base.study.storage or default_storage_url(out)
    calibrated = any(e.decision not in (None, "argmax") for e in entries)
    session = Session(model=base.model, data=base.data, out=out, batch_size=base.batch_size, keep_hidden=calibrated)
    proposals, pending = None, None
    if options.propose is not None:  # before the plan: every study's identity hashes the grown space
        from promptopt.workflows.propose.rounds import PENDING, PROPOSALS_DIR
        from promptopt.workflows.propose.workflow import propose_space

        if options.propose.mode == "history":
            raise ConfigError(
                "compare --propose-mode history: history proposals come from search rounds (search --rounds)"
            )
        out.mkdir(parents=True, exist_ok=True)
        proposed = propose_space(
            session, options.propose, space=base.study.space, out=out / PENDING, cache_dir=out / PROPOSALS_DIR
        )
        base, proposals, pending = base.replace(space=str(proposed.path)), proposed.proposals, proposed.path
    seeds = options.seeds
    configs = {(e.name, s): seed_config(base, e, s, seeds, out, storage) for e in entries for s in range(seeds)}
    expand = None
    if any(get_strategy(e.strategy).needs_variants for e in entries):
        from promptopt.robustness import VariantExpander

        expand = VariantExpander(options.search_suite_spec)
    try:
        # the compare's own record of the suite its robust studies trained on speaks first (it names the suite to
        # resume with); then every study is checked (a resumed one's identity hashes that suite as well)
        resume = base.study.resume
        marker = search_suite_marker(out, options.search_suite, resume=resume) if expand is not None else None
        configs = plan_studies(configs, session.data, expand, out, resume=resume)  # before anything is scored
    except BaseException:
        if pending is not None:
            pending.unlink(missing_ok=True)  # refused: the space file of the earlier run stays as it was
        raise
    if base.study.resume:  # the temporaries a killed compare left (its studies' folders and evaluations too)
        remove_orphaned_temporaries(out, recursive=True)
    if pending is not None:  # the plan holds with the proposed space: put it in place, under its final name
        final = out / "space.yaml"
        os.replace(pending, final)
        configs = {key: config.replace(space=str(final)) for key, config in configs.items()}
    return _Plan(base, session, configs, expand, marker, proposals, session.items("test"), session.items("dev"))


def evaluation_resume_key(base: SearchConfig, test: list, dev: list, options: _Options) -> dict:
    """What a stored evaluation depends on: `--resume` reuses one (evaluations/ in the run directory) only where
    this key is the same, and a change to anything here evaluates every prompt afresh."""
    from promptopt.robustness.suite import suite_sha256

    return {
        "model": base.model.spec,
        "dtype": base.model.resolved_dtype(),
        "quantize": base.model.quantize,
        "test": items_sha256(test),
        "robust_limit": options.robust_limit,
        "suite": suite_sha256(options.suite) if options.suite else None,
        "search_suite": suite_sha256(options.search_suite) if options.search_suite else None,
        "format": 2,  # evaluations keep decided answers (decision scores, the fitted rule)
        "dev": items_sha256(dev),  # decision rules are fit on the dev items
    }


def _evaluator(plan: _Plan, out: Path, options: _Options) -> Evaluator:
    """One evaluator for every prompt of the compare, its store keyed by `evaluation_resume_key`."""
    from promptopt.robustness.suite import Similarity, seen_families

    store = EvaluationStore(out / "evaluations", evaluation_resume_key(plan.base, plan.test, plan.dev, options))
    suite, search_suite = options.suite, options.search_suite
    return Evaluator(
        plan.session,
        plan.test,
        suite,
        options.robust_limit,
        Similarity() if suite or search_suite else None,
        options.show_progress,
        store,
        search_suite=search_suite,
        seen=seen_families(suite, search_suite) if suite else frozenset(),
        dev=plan.dev,
    )


def _baseline(plan: _Plan, evaluator: Evaluator, options: _Options) -> _Searched:
    """The task's default prompt, evaluated as every winner is (it is not searched): the first row of the tables."""
    start = time.perf_counter()
    baseline = evaluator(plan.session.data.default_prompt())
    row = run_record(
        "baseline", 0, 0, baseline, winner=True, how="the task's default prompt", card="task default prompt"
    )
    return _Searched(
        runs=[row], winners={"baseline": [baseline] * options.seeds}, baseline_seconds=time.perf_counter() - start
    )


def _searches(plan: _Plan, evaluator: Evaluator, options: _Options, searched: _Searched, out: Path) -> None:
    """Each study run (or resumed), its top-N trials evaluated and its winner chosen, its ensembles built."""
    if plan.marker is not None:  # written where the robust studies are about to be: they were searched under it
        atomic_write_text(out / SEARCH_SUITE_FILE, json.dumps(plan.marker, indent=1))
    scorer, dev = plan.session.scorer, plan.dev
    for (name, s), config in plan.configs.items():
        fault_point("compare-search")
        result = run_search(config, scorer=scorer, expand=plan.expand, show_progress=options.show_progress)
        searched.walls[name] = searched.walls.get(name, 0.0) + result.wall_seconds
        detail = result.selection_detail or {}
        searched.choices.append(
            {
                "strategy": name,
                "seed": s,
                "tied": len(detail.get("tie_set", [])),
                **{k: detail.get(k) for k in _CHOICE_KEYS},
            }
        )
        _evaluate_top(name, s, result, evaluator, options, searched, dev)
        if options.ensembles and name in options.ensemble_of:
            for k, (evaluated, row) in build_ensembles(
                result, options.ensembles, evaluator, dev, objective=options.ensemble_objective, seed=s, entry=name
            ).items():
                searched.winners.setdefault(ensemble_name(name, k), []).append(evaluated)
                searched.runs.append(row)


def _evaluate_top(name: str, s: int, result, evaluator: Evaluator, options: _Options, searched: _Searched, dev) -> None:
    """A search's top-N distinct trials scored on the test items and stressed; its winner chosen on dev."""
    ranked = result.ranking[: options.top_n] or [
        {
            "number": result.best_number,
            "prompt": result.prompt,
            "accuracy": result.dev["accuracy"],
            "n": result.dev["n"],
        }
    ]
    chosen, how = choose_winner(options.select, ranked, result, evaluator, dev)
    for rank, entry in enumerate(ranked):
        evaluated = evaluator(entry["prompt"])
        is_winner = entry["number"] == chosen["number"]
        searched.runs.append(
            run_record(
                name,
                s,
                rank,
                evaluated,
                winner=is_winner,
                how=how if is_winner else "",
                trial=entry["number"],
                dev_accuracy=entry.get("accuracy"),
                # what export's selection pairs candidates on (dev only): answers, stability, cost
                dev_correct=encode_answers(entry["correct"]) if "correct" in entry else None,
                dev_signed_stability=entry.get("signed_stability"),
                cost=entry.get("cost"),
                card=str(result.card_path) if entry["number"] == result.best_number else "",
            )
        )
        if is_winner:
            searched.winners.setdefault(name, []).append(evaluated)


def _summary(plan, entries, evaluator, options, searched, table, paired, short, out) -> dict:
    """summary.json: what was compared, how, and what was reused."""
    the_suite, search_suite, session = options.suite, options.search_suite, plan.session
    seen = evaluator.seen
    families = [f.name for f in the_suite.families] if the_suite else []
    summary = {
        "task": session.data.spec.name,
        "model": plan.base.model.spec,
        "strategies": [e.name for e in entries],
        "ensembles": {
            "sizes": list(options.ensembles),
            "of": list(options.ensemble_of),
            "objective": options.ensemble_objective,
            "left_out": short,
        }
        if options.ensembles
        else None,
        "seeds": options.seeds,
        "top_n": options.top_n,
        "select": options.select,
        "suite": the_suite.name if the_suite else None,
        "search_suite": search_suite.name if search_suite else None,
        "families_seen": [f for f in families if f in seen],
        "families_unseen": [f for f in families if f not in seen],
        "seen_rule": "a judged family is seen when the search suite has a family of the same name or operator",
        "n_test": len(plan.test),
        "baseline_evaluation_seconds": searched.baseline_seconds,
        "n_robust": len(plan.test[: options.robust_limit]) if the_suite else 0,
        "evaluations": evaluator.evaluations,
        "evaluations_reused": evaluator.reused,
        "evaluations_resumed": evaluator.resumed,
        "studies_resumed": [c.name for c in plan.configs.values() if c.study.resume],
        "result_cache_hit_rate": session.scorer.cache.hit_rate,
        "result_cache_hits": session.scorer.cache.hits,
        "result_cache_misses": session.scorer.cache.misses,
        "variant_embedding_hit_rate": evaluator.similarity.hit_rate if evaluator.similarity else None,
        "paraphrase_memo_hits": session.paraphrases.hits,
        "paraphrase_memo_misses": session.paraphrases.misses,
        "dev_choices": searched.choices,
        "table": json.loads(table.to_json(orient="records")),
        "paired": json.loads(paired.to_json(orient="records")),
    }
    if plan.proposals is not None:
        proposals = plan.proposals
        summary["proposals"] = {
            "space": str(out / "space.yaml"),
            "accepted": len(proposals.accepted),
            "drops": proposals.drops,
            "attempts": proposals.attempts,
            "reused": proposals.reused,
        }
    return summary


def left_out_ensembles(winners: dict, seeds: int) -> dict[str, str]:
    """Ensemble entries some seed could not build (its search found fewer distinct trials than the ensemble has
    members), with why: the tables pair entries on (seed, item), so such an entry is left out, and said."""
    return {
        name: f"{len(evaluated)} of {seeds} seeds' searches found enough distinct trials for it"
        for name, evaluated in winners.items()
        if ENSEMBLE_SUFFIX.search(name) and len(evaluated) < seeds
    }
