"""`run_compare`, top to bottom: validate, plan every study, evaluate the baseline, run each search and evaluate
its top-N trials, choose the winners, build the tables, write them (see the package docstring for what it
measures)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
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
from promptopt.workflows.compare.evaluate import Evaluated, EvaluationStore, Evaluator
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
    the_suite = load_suite(suite) if suite else None
    the_search_suite = load_suite(search_suite) if search_suite else None
    out = Path(base.out)
    check_output(out, folder=True, what="--out")
    made_out = not out.exists()
    try:
        return _compare(
            base,
            entries,
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
            ensembles=tuple(ensembles),
            ensemble_of=list(ensemble_of) if ensemble_of else [e.name for e in entries],
            ensemble_objective=ensemble_objective,
        )
    except Exception:  # folders this compare created and left empty go too (finished work stays for --resume)
        if made_out:
            remove_empty_dirs([out, *(p for p in out.rglob("*") if p.is_dir())])
        raise


def _compare(
    base: SearchConfig,
    entries: list,
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
    ensembles: tuple[int, ...] = (),
    ensemble_of: list[str] = (),
    ensemble_objective: str = "accuracy",
) -> CompareResult:
    from promptopt.robustness.suite import Similarity, seen_families, suite_sha256

    storage = base.study.storage or default_storage_url(out)
    strategies = [e.name for e in entries]
    calibrated = any(e.decision not in (None, "argmax") for e in entries)
    session = Session(model=base.model, data=base.data, out=out, batch_size=base.batch_size, keep_hidden=calibrated)
    proposals, pending = None, None
    if propose is not None:  # before the plan: every study's identity hashes the grown space
        from promptopt.workflows.propose.rounds import PENDING, PROPOSALS_DIR
        from promptopt.workflows.propose.workflow import propose_space

        if propose.mode == "history":
            raise ConfigError(
                "compare --propose-mode history: history proposals come from search rounds (search --rounds)"
            )
        out.mkdir(parents=True, exist_ok=True)
        proposed = propose_space(
            session, propose, space=base.study.space, out=out / PENDING, cache_dir=out / PROPOSALS_DIR
        )
        base, proposals, pending = base.replace(space=str(proposed.path)), proposed.proposals, proposed.path
    configs = {(e.name, s): seed_config(base, e, s, seeds, out, storage) for e in entries for s in range(seeds)}
    expand = None
    if any(get_strategy(e.strategy).needs_variants for e in entries):
        from promptopt.robustness import VariantExpander

        expand = VariantExpander(search_suite_spec)
    try:
        # the compare's own record of the suite its robust studies trained on speaks first (it names the suite to
        # resume with); then every study is checked (a resumed one's identity hashes that suite as well)
        marker = search_suite_marker(out, search_suite, resume=base.study.resume) if expand is not None else None
        configs = plan_studies(
            configs, session.data, expand, out, resume=base.study.resume
        )  # before anything is scored
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
    test, dev = session.items("test"), session.items("dev")
    search_digest = suite_sha256(search_suite) if search_suite else None
    store = EvaluationStore(
        out / "evaluations",
        {
            "model": base.model.spec,
            "dtype": base.model.resolved_dtype(),
            "quantize": base.model.quantize,
            "test": items_sha256(test),
            "robust_limit": robust_limit,
            "suite": suite_sha256(the_suite) if the_suite else None,
            "search_suite": search_digest,
            "format": 2,  # evaluations keep decided answers (decision scores, the fitted rule)
            "dev": items_sha256(dev),  # decision rules are fit on the dev items
        },
    )
    seen = seen_families(the_suite, search_suite) if the_suite else frozenset()
    evaluator = Evaluator(
        session,
        test,
        the_suite,
        robust_limit,
        Similarity() if the_suite or search_suite else None,
        show_progress,
        store,
        search_suite=search_suite,
        seen=seen,
        dev=dev,
    )

    start = time.perf_counter()
    baseline_prompt = session.data.default_prompt()
    baseline = evaluator(baseline_prompt)
    runs = [
        run_record(
            "baseline",
            0,
            0,
            baseline,
            winner=True,
            how="the task's default prompt",
            card="task default prompt",
        )
    ]
    winners: dict[str, list[Evaluated]] = {"baseline": [baseline] * seeds}
    baseline_seconds = time.perf_counter() - start  # evaluating the default prompt: it is not searched
    walls: dict[str, float] = {}
    choices: list[dict] = []  # each search's dev choice: tie set size, tie-break, the detectable difference
    if marker is not None:  # written where the robust studies are about to be: they were searched under it
        atomic_write_text(out / SEARCH_SUITE_FILE, json.dumps(marker, indent=1))
    for (name, s), config in configs.items():
        fault_point("compare-search")
        result = run_search(config, scorer=session.scorer, expand=expand, show_progress=show_progress)
        walls[name] = walls.get(name, 0.0) + result.wall_seconds
        detail = result.selection_detail or {}
        choices.append(
            {
                "strategy": name,
                "seed": s,
                "tied": len(detail.get("tie_set", [])),
                **{k: detail.get(k) for k in _CHOICE_KEYS},
            }
        )
        ranked = result.ranking[:top_n] or [
            {
                "number": result.best_number,
                "prompt": result.prompt,
                "accuracy": result.dev["accuracy"],
                "n": result.dev["n"],
            }
        ]
        chosen, how = choose_winner(select, ranked, result, evaluator, dev)
        for rank, entry in enumerate(ranked):
            evaluated = evaluator(entry["prompt"])
            is_winner = entry["number"] == chosen["number"]
            runs.append(
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
                winners.setdefault(name, []).append(evaluated)
        if ensembles and name in ensemble_of:
            for k, (evaluated, row) in build_ensembles(
                result, ensembles, evaluator, dev, objective=ensemble_objective, seed=s, entry=name
            ).items():
                winners.setdefault(ensemble_name(name, k), []).append(evaluated)
                runs.append(row)
    short = left_out_ensembles(winners, seeds)
    for name, why in short.items():  # pairs are (seed, item): an entry missing a seed pairs with nothing
        del winners[name]
        runs = [r for r in runs if r.strategy != name]
        print(f"note: {name} left out of the tables: {why}", file=sys.stderr, flush=True)  # a result: even --quiet
    runs_table = pd.DataFrame([r.columns() for r in runs])
    table = strategy_table(runs_table, winners, walls, seed=base.study.seed)
    paired = paired_table(winners, seed=base.study.seed)
    families = [f.name for f in the_suite.families] if the_suite else []
    summary = {
        "task": session.data.spec.name,
        "model": base.model.spec,
        "strategies": strategies,
        "ensembles": {
            "sizes": list(ensembles),
            "of": list(ensemble_of),
            "objective": ensemble_objective,
            "left_out": short,
        }
        if ensembles
        else None,
        "seeds": seeds,
        "top_n": top_n,
        "select": select,
        "suite": the_suite.name if the_suite else None,
        "search_suite": search_suite.name if search_suite else None,
        "families_seen": [f for f in families if f in seen],
        "families_unseen": [f for f in families if f not in seen],
        "seen_rule": "a judged family is seen when the search suite has a family of the same name or operator",
        "n_test": len(test),
        "baseline_evaluation_seconds": baseline_seconds,
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
        "dev_choices": choices,
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
    write_outputs(
        out, table, runs_table, paired, summary, winner_robustness_answers(winners), winner_test_answers(winners)
    )
    return CompareResult(table, runs_table, paired, summary, proposals, base.storage_url, Path(base.out))


def left_out_ensembles(winners: dict, seeds: int) -> dict[str, str]:
    """Ensemble entries some seed could not build (its search found fewer distinct trials than the ensemble has
    members), with why: the tables pair entries on (seed, item), so such an entry is left out, and said."""
    return {
        name: f"{len(evaluated)} of {seeds} seeds' searches found enough distinct trials for it"
        for name, evaluated in winners.items()
        if ENSEMBLE_SUFFIX.search(name) and len(evaluated) < seeds
    }
