"""`promptopt search`: one Optuna study over instructions × exemplar sets × orders × templates.

Everything a run needs is validated before anything exists (task, space, strategy, output folder, model,
that every prompt of the space fits the model, and on --resume that the study means the same thing), so
a run that never starts leaves no file and no study row. Storage is any Optuna RDB URL (SQLite file in the
run directory by default; PostgreSQL for many workers).

A trial that a process could not finish (kill -9, Ctrl-C, lost storage) is marked FAIL and its parameters
are enqueued again through the storage's retry callback, so nothing is lost; only COMPLETE/PRUNED trials
count towards the budget, so nothing is counted twice (recovery.py says when a trial counts as abandoned).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from promptopt import progress as steps
from promptopt.errors import ConfigError
from promptopt.study.config import SearchConfig, redact, sqlite_path
from promptopt.study.context import (
    SearchContext,
    SearchResult,
    build_context,
    check_prompts_fit,
    dev_size_note,
    fit_space_to_model,
    note,
    require_variants,
    warn_once,
)
from promptopt.study.identity import check_same_study, check_study, half_created, identity, scrub_stored_config
from promptopt.study.incumbent import find as find_incumbent
from promptopt.study.incumbent import label
from promptopt.study.outputs import report_leftovers, write_outputs
from promptopt.study.recovery import counts, fault_point, storage_errors, worker_name
from promptopt.study.storage import (
    claim_sqlite_file,
    existing_storage,
    fold_wal,
    make_storage,
    open_study,
    quiet_optuna,
    remove_new_sqlite,
    stored_study,
)
from promptopt.study.trial import SCAN_PARAMS, add_incumbent, is_duplicate, optimize
from promptopt.study.workers import workers
from promptopt.yamlio import atomic_write_text, check_output


def run_search(
    config: SearchConfig,
    *,
    scorer=None,
    data=None,
    expand=None,
    show_progress: bool = True,
    enqueue: tuple[dict, ...] = (),
) -> SearchResult:
    """Run (or resume) the study of `config` and write its run directory.

    `scorer`: a CachedScorer to use (an experiment session passes its own, so the model is loaded once);
    without one, the task data is loaded and checked first, then the model, with the result cache in the
    run directory. Worker processes (`n_workers` > 1) build their own scorer from a ScorerFactory.
    `expand`: perturbed variants of dev items for the `robust` strategy (promptopt.robustness.VariantExpander).
    `data`: the task data to search on, when it is not the scorer's own (e.g. a subset of its dev items:
    `diagnose conflicts` searches on the ambiguous questions only); single-worker runs only.
    `enqueue`: parameters a new study tries first (a warm start: `search --rounds` starts each round from the
    previous round's best); a resumed study has them already.

    Order: everything that can fail on input is checked before the first file or study row exists."""
    from promptopt.scoring import ScorerFactory

    quiet_optuna()
    out = Path(config.out)
    check_output(out, folder=True, what="--out")
    made_out = not out.exists()
    if data is not None and config.study.n_workers > 1:
        raise ConfigError("run_search(data=...): worker processes load the task's own data; use n_workers=1")
    data = data if data is not None else scorer.data if scorer is not None else config.data.load()
    ctx = build_context(config, data, expand)  # task, space, strategy
    require_variants(ctx)
    if scorer is None:
        config.model.check()  # the model resolves, the device exists, 4/8-bit has CUDA
    current = identity(ctx)
    with storage_errors(config), existing_storage(config) as storage:
        joins = check_study(config, storage, current)  # a resumed study means the same thing
        exists = storage is not None
    if config.study.resume and not joins:  # killed before its study was made: --resume starts it
        if show_progress:
            note(True)(f"--resume: no study '{config.name}' in {redact(config.storage_url)} yet: starting it")
        config = config.replace(resume=False)
        ctx = build_context(config, data, expand)
        current = identity(ctx)
    start = time.perf_counter()
    factory = ScorerFactory(
        model=config.model, data=config.data, cache_path=str(out / "cache.sqlite"), batch_size=config.batch_size
    )
    if scorer is None:  # a model or cache that fails to load fails here, before anything is written
        steps.step(f"loading model {config.model.spec}")  # as score and compare say it: seconds without output else
        scorer = factory.build(data)
    else:
        factory = ScorerFactory(
            model=config.model, data=config.data, cache_path=str(scorer.cache.path), batch_size=config.batch_size
        )
    fit_space_to_model(ctx, scorer.lm.tokenizer, note(show_progress))
    check_prompts_fit(ctx, scorer)
    # a winner chosen on too few dev items is said before the run, once every input check has passed (a run that
    # fails on input prints its one error line alone)
    warn_once(dev_size_note(config, len(ctx.dev)))
    creates = not exists and sqlite_path(config.storage_url) is not None
    fault_point("create-storage")
    if creates:
        claim_sqlite_file(config)  # a run started at the same instant on this --out is told to --resume
    storage = None
    try:
        with storage_errors(config):
            storage = make_storage(config)
            result = _run(ctx, storage, scorer, factory, current, start, show_progress, enqueue)
        fault_point("checkpoint")
    except Exception:  # a full disk, a lost storage, any error: a run that finished no trial leaves nothing
        if creates and remove_new_sqlite(config, storage) and made_out:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if storage is not None:
            storage.engine.dispose()
    # SQLite's write-ahead log folded into study.db, and checked: the file alone is the study, or the run says so
    fold_wal(config)
    return result


def may_run(config: SearchConfig, data, expand=None, *, may_create: bool = False) -> bool:
    """Whether the study of `config` exists, having made the checks run_search makes before it writes anything:
    a new run finds no study in its way (`may_create`: nor does a resumed one need to) and a resumed one means the
    same thing (one UserError otherwise). Creates nothing (a half-created study counts as missing)."""
    quiet_optuna()
    ctx = build_context(config, data, expand)
    require_variants(ctx)
    with storage_errors(config), existing_storage(config) as storage:
        if may_create and stored_study(config, storage) is None:
            return False
        return check_study(config, storage, identity(ctx), repair=False)


def study_exists(config: SearchConfig, data, expand=None) -> bool:
    """Whether the study of `config` exists, having checked what `check_search` checks and, for an existing
    study, that a resume may join it (one UserError otherwise). Creates nothing: a caller running several
    studies (compare) decides which to resume and which to create before any of them costs anything."""
    quiet_optuna()
    ctx = build_context(config, data, expand)
    require_variants(ctx)
    with storage_errors(config), existing_storage(config) as storage:
        stored = stored_study(config, storage)
        if stored is not None and half_created(stored):  # run_search deletes it and starts the study
            return False
        if stored is not None:
            check_same_study(config, stored, identity(ctx))
    return stored is not None


def _scan(ctx: SearchContext, study, cached, incumbent, say) -> dict | None:
    """The sensitivity scan (study/scan.py), once per study (a resumed study keeps its record): its verdict printed,
    its record in the study's user attrs and summary.json. None when off."""
    from promptopt.metrics.stats.selection import decode_answers
    from promptopt.study.scan import run_scan

    if ctx.config.study.scan == "off":
        return None
    record = study.user_attrs.get("scan")
    if record is None:
        steps.step("scan: sampling the space on a dev slice to see whether searching can pay")
        correct = decode_answers(incumbent.user_attrs.get("dev_correct")) if incumbent is not None else None
        found = run_scan(ctx, cached, correct)
        record = (
            found.record()
            if found is not None
            else {
                "verdict": "none",
                "why": "the space holds fewer than 2 prompts other than the incumbent: no spread to measure",
            }
        )
        if found is not None:  # the search's first phase: its prompts, the first trials (queued one at a time by
            study.set_user_attr(SCAN_PARAMS, found.params)  # study/trial.py `optimize`, unless the scan is off)
        fault_point("scan")
        study.set_user_attr("scan", record)
    if say is not None:
        say(f"scan: {record['verdict']}: {record['why']}")
    return record


def _run(
    ctx: SearchContext,
    storage,
    cached,
    factory,
    current: dict,
    start: float,
    show_progress: bool,
    enqueue: tuple[dict, ...] = (),
) -> SearchResult:
    """The study, its workers and the run directory, once everything is validated."""
    from tqdm.auto import tqdm

    config, out = ctx.config, Path(ctx.config.out)
    joined = config.study.resume
    hits_before, misses_before = cached.cache.hits, cached.cache.misses
    study = open_study(config, ctx.strategy, storage, index=0, create=not joined, n_items=len(ctx.dev), current=current)
    if ctx.incumbent is not None and find_incumbent(study) is None:
        steps.step(
            f"scoring the incumbent ({label(config.study.incumbent, config.study.decision)}) on {len(ctx.dev)} dev items"
        )
    incumbent = add_incumbent(ctx, study, cached)  # trial 0 of a new study: every trial is raced against it
    if not joined:
        for params in enqueue:
            study.enqueue_trial(params, skip_if_exists=True)
    scrub_stored_config(study)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(config.public_dict(), indent=1))
    atomic_write_text(out / "splits.json", json.dumps(ctx.data.carving(), indent=1))
    scan = _scan(ctx, study, cached, incumbent, note(show_progress))
    budget = config.study.trials
    # a bar on a terminal; in a log (not a terminal) one line per finished trial instead of the bar's redraws
    as_bar = show_progress and (steps.bars() or not steps.enabled())
    bar = tqdm(total=budget, initial=min(counts(study)[0], budget), desc=f"search {config.name}", disable=not as_bar)

    def progress(study_, trial_):
        done = min(counts(study_)[0], budget)
        best = None
        if not ctx.strategy.multi_objective:
            try:
                best = (study_.best_value, study_.best_trial.number)
            except ValueError:
                pass
        if as_bar:
            bar.n = done
            if best is not None:
                bar.set_postfix(best=f"{best[0]:.4f}", trial=best[1])
            bar.refresh()
        elif show_progress and trial_ is not None:
            state = {"PRUNED": "pruned", "FAIL": "failed"}.get(trial_.state.name, "finished")
            if is_duplicate(trial_):
                state = f"skipped (the prompt of trial {trial_.user_attrs['duplicate_of']}; not counted)"
            elif trial_.state.name == "PRUNED" and "dev_items" in trial_.user_attrs:
                state = f"pruned after {trial_.user_attrs['dev_items']} of {len(ctx.dev)} dev items"
            steps.step(
                f"{config.name}: trial {trial_.number} {state} ({done}/{budget} done)"
                + (f"; best {best[0]:.4f} (trial {best[1]})" if best is not None else "")
            )

    spent = float(study.user_attrs.get("search_seconds", 0.0)) + time.perf_counter() - start
    budget_minutes = config.study.budget_minutes
    deadline = None if budget_minutes is None else time.monotonic() + 60 * budget_minutes - spent
    stop = config.study.scan == "stop" and scan is not None and scan["verdict"] not in ("search", "none")
    if stop and show_progress:
        note(True)(f"scan: {scan['verdict']}: no trial is run (--scan stop); the incumbent is kept")
    try:
        if not stop:
            with workers(config, factory, ctx.expand):  # this process is worker 0; its model is loaded anyway
                optimize(ctx, study, cached, progress, worker_name(0), note=note(show_progress), deadline=deadline)
        progress(study, None)
    finally:
        bar.close()
    # the study's search time, summed over the runs that worked on it (a resumed or rerun study keeps what the
    # earlier runs spent instead of reporting its own few seconds; runs on several machines add up)
    wall = float(study.user_attrs.get("search_seconds", 0.0)) + time.perf_counter() - start
    study.set_user_attr("search_seconds", wall)
    result = write_outputs(ctx, study, cached, wall, hits_before, misses_before)
    report_leftovers(study, show_progress)
    return result


__all__ = ["SearchResult", "may_run", "run_search", "study_exists"]
