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

import hashlib
import json
import multiprocessing
import os
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.errors import ConfigError, PromptTooLongError, StorageError, UserError
from promptopt.prompts import Prompt
from promptopt.search.config import SearchConfig, redact
from promptopt.search.objectives import Strategy, get_strategy, select_winner
from promptopt.search.recovery import (
    counts,
    fault_point,
    first_line,
    give_back,
    pid_namespace,
    quiet_optuna,
    recover,
    retry_callback,
    storage_errors,
    worker_name,
    worker_seed,
)
from promptopt.search.space import SearchSpace, load_space
from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text, check_output


@dataclass
class SearchResult:
    config: SearchConfig
    trials: pd.DataFrame
    best_params: dict
    best_number: int
    prompt: Prompt  # the winner, decoded
    dev: dict
    test: dict
    card_path: Path
    wall_seconds: float
    cache_hit_rate: float
    pareto: pd.DataFrame | None = None
    selection: str = ""  # how the winner was chosen, in words
    ranking: list = field(default_factory=list)  # distinct trials in the strategy's order of preference


# --- set-up, all validated before a study exists ----------------------------------------------------
@dataclass
class _Context:
    config: SearchConfig
    strategy: Strategy
    space: SearchSpace
    data: object  # TaskData
    candidates: list
    dev: list
    test: list
    expand: object = None  # (scorer, prompt, items) -> [(variant prompt, variant items)], for `robust`


def _context(config: SearchConfig, data, expand=None) -> _Context:
    """Strategy, space and items of a run, checked against the task's data."""
    strategy = get_strategy(config.study.strategy)
    if strategy.needs_variants and expand is None:
        raise ConfigError(f"strategy '{strategy.name}' needs perturbed variants of the dev items: run it through the "
                          "promptopt CLI or pass expand= (promptopt.robustness.VariantExpander)")
    space = load_space(config.study.space or data.spec.name)
    candidates = space.check_against(data, pool_draw=config.study.pool_draw)
    return _Context(config, strategy, space, data, candidates, config.data.dev(data), config.data.test(data), expand)


def _with_robust_correct(table: pd.DataFrame, groups, cached) -> pd.DataFrame:
    """Add robust_correct: the item is right on the clean prompt and on every one of its variants."""
    ok = dict(zip(table["item_id"], table["correct"].astype(bool)))
    for variant_prompt, items in groups:
        for item_id, correct in zip([i.id for i in items], cached.score_table(variant_prompt, items)["correct"]):
            ok[item_id] = ok[item_id] and bool(correct)
    return table.assign(robust_correct=table["item_id"].map(ok).astype(bool))


def check_search(config: SearchConfig, data, expand=None) -> None:
    """Everything about a search that can be checked against the task data without a model or a study."""
    _context(config, data, expand)


def _file_sha256(where: str) -> str | None:
    path = Path(where)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _items_sha256(items) -> str:
    content = [[i.id, i.question, list(i.choices) if i.choices else None, repr(i.gold)] for i in items]
    return hashlib.sha256(json.dumps(content).encode()).hexdigest()


def identity(ctx: _Context) -> dict:
    """What a trial's value depends on. A resumed study must match it field by field; the other settings
    (seed, which only seeds the sampler; minibatch and pruning, which only decide pruning; workers, batch
    size, device, budget, storage URL, test items) may change."""
    config = ctx.config
    return {
        "task": ctx.data.spec.name,
        "task_file_sha256": _file_sha256(ctx.data.spec.where),
        "subsets": list(config.data.subsets or []),
        "dev_limit": config.data.dev_limit,
        "dev_items_sha256": _items_sha256(ctx.dev),
        "pool_candidates_sha256": _items_sha256(ctx.candidates),
        "strategy": config.study.strategy,
        "space_file_sha256": _file_sha256(ctx.space.where),
        "model": config.model.spec,
        "dtype": config.model.resolved_dtype(),
        "quantize": config.model.quantize,
    }


def _legacy_identity(stored_config: dict) -> dict:
    """The comparable part of a study created before identities were recorded."""
    data, study, model = stored_config.get("data", {}), stored_config.get("study", {}), stored_config.get("model", {})
    return {"subsets": list(data.get("subsets") or []), "dev_limit": data.get("dev_limit"), "strategy": study.get("strategy"),
            "model": model.get("spec"), "quantize": model.get("quantize")}


def check_resumable(name: str, stored: dict, current: dict) -> None:
    """Refuse to resume a study whose trial values meant something else, naming the first differing field."""
    for key, then in stored.items():
        if key in current and current[key] != then:
            now = current[key]
            if key.endswith("_sha256"):
                then, now = str(then)[:12], str(now)[:12]
            raise UserError(
                f"--resume: study '{name}' was created with {key}={then!r} but this run has {key}={now!r}, so its trial "
                "values would mean something else; resume with the same settings, or start a new study (--out / --study-name)"
            )


def _longest_exemplars(candidates: list, k: int) -> tuple:
    size = lambda item: len(item.question) + len(str(item.target)) + sum(len(c) for c in item.choices or ())  # noqa: E731
    return tuple(item.as_exemplar() for item in sorted(candidates, key=size, reverse=True)[:k])


def check_prompts_fit(ctx: _Context, scorer) -> None:
    """Every prompt the space can produce must fit the model: each instruction × template with the k_max
    longest candidate shots, on the longest dev/test items. Checked before the study exists, so a space
    that cannot fit fails with one line and leaves nothing behind."""
    space, spec = ctx.space, ctx.data.spec
    shots = _longest_exemplars(ctx.candidates, space.k_max)
    by_size = lambda item: len(item.question) + sum(len(c) for c in item.choices or ())  # noqa: E731
    items = sorted(ctx.dev + ctx.test, key=by_size, reverse=True)[:3]
    for instruction_name, instruction in space.instructions.items():
        for template_name, template in space.templates.items():
            prompt = Prompt(task=spec.name, instruction=instruction, exemplars=shots, template=template)
            try:
                scorer.check_fits(prompt, items)
            except PromptTooLongError as exc:
                raise PromptTooLongError(
                    f"{space.where}: instruction '{instruction_name}' with template '{template_name}' and {len(shots)} shots "
                    f"does not fit: {exc}"
                ) from None


# --- storage --------------------------------------------------------------------------------------
def make_storage(config: SearchConfig):
    """An RDBStorage with heartbeat and retry of stale trials; unreachable URLs become one clear error."""
    from optuna import storages

    url = config.storage_url
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    callback_kw = "heartbeat_stale_trial_callback" if hasattr(storages, "RetryHeartbeatStaleTrialCallback") else "failed_trial_callback"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat and the retry callback are "experimental" in Optuna
        try:
            return storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=config.study.heartbeat_interval,
                grace_period=config.study.grace_period,
                **{callback_kw: retry_callback()(max_retry=3)},
            )
        except Exception as exc:  # any failure to open a user-given URL is the URL's problem
            raise StorageError(f"cannot open storage {redact(url)}: {first_line(exc)}") from None


def _existing_storage(config: SearchConfig):
    """The storage if it may hold the study; None for an SQLite file that does not exist yet (it is created
    with the study, so a run that fails validation leaves no empty study.db)."""
    url = config.storage_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return None
    return make_storage(config)


def _stored_study(config: SearchConfig, storage):
    """The named study's summary, or None."""
    import optuna

    if storage is None:
        return None
    return next((s for s in optuna.get_all_study_summaries(storage, include_best_trial=False) if s.study_name == config.name), None)


def _check_study(config: SearchConfig, storage, current: dict) -> None:
    """The study exists exactly when --resume says so, and a resumed one means the same thing."""
    stored = _stored_study(config, storage)
    where = redact(config.storage_url)
    if stored is not None and not config.study.resume:
        raise UserError(f"study '{config.name}' already exists in {where}: pass --resume to continue it, or choose another --out / --study-name")
    if stored is None and config.study.resume:
        raise UserError(f"--resume: no study '{config.name}' in {where}")
    if stored is not None:
        attrs = stored.user_attrs
        then = json.loads(attrs["identity"]) if "identity" in attrs else _legacy_identity(json.loads(attrs.get("config", "{}")))
        check_resumable(config.name, then, current)


def scrub_stored_config(study) -> None:
    """Studies created before passwords were redacted hold the storage URL in clear in their "config"
    attribute (shown by optuna-dashboard): rewrite it redacted when such a study is resumed."""
    raw = study.user_attrs.get("config")
    try:
        stored = json.loads(raw) if raw else None
        url = stored["study"]["storage"] if stored else None
    except (ValueError, KeyError, TypeError):
        return
    if url and redact(url) != url:
        stored["study"]["storage"] = redact(url)
        study.set_user_attr("config", json.dumps(stored))


def _sampler(config: SearchConfig, strategy: Strategy, seed: int):
    from optuna.samplers import NSGAIISampler, TPESampler

    trials = config.study.trials
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if strategy.multi_objective:
            return NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
        return TPESampler(seed=seed, n_startup_trials=max(1, min(10, trials // 3)), multivariate=True, group=True)


def _pruner(config: SearchConfig, strategy: Strategy):
    from optuna.pruners import NopPruner, WilcoxonPruner

    if not config.study.pruning or strategy.multi_objective:
        return NopPruner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WilcoxonPruner(p_threshold=0.1, n_startup_steps=config.study.minibatch)


def _open_study(config: SearchConfig, strategy: Strategy, storage, *, index: int, joined: bool, create: bool,
                current: dict | None = None):
    """Create the study (recording its public config and identity) or load it, with this worker's sampler."""
    import optuna

    n_existing = len(optuna.load_study(study_name=config.name, storage=storage).trials) if not create else 0
    sampler = _sampler(config, strategy, worker_seed(config.study.seed, index, joined=joined, n_existing=n_existing))
    if not create:
        return optuna.load_study(study_name=config.name, storage=storage, sampler=sampler, pruner=_pruner(config, strategy))
    try:
        study = optuna.create_study(study_name=config.name, storage=storage, directions=list(strategy.directions),
                                    sampler=sampler, pruner=_pruner(config, strategy))
    except optuna.exceptions.DuplicatedStudyError:
        raise UserError(f"study '{config.name}' was just created by another process: pass --resume to join it") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.set_metric_names(["accuracy", "signed_stability"] if strategy.multi_objective else [strategy.name])
    study.set_user_attr("config", json.dumps(config.public_dict()))
    study.set_user_attr("identity", json.dumps(current))
    return study


# --- the objective -------------------------------------------------------------------------------
def _trial_summary(table: pd.DataFrame) -> dict:
    from promptopt.scoring import summarize
    from promptopt.search.objectives import signed_stability

    s = summarize(table)
    keys = ("accuracy", "tcb_mean", "tcb_median", "tcb_geomean", "v_eff_mean", "ppl_mean", "n")
    out = {k: s[k] for k in keys if k in s}
    out["signed_stability"] = float(signed_stability(table).mean())
    out["answer_nll_mean"] = float(table["answer_nll"].mean()) if "answer_nll" in table else float("nan")
    if "robust_correct" in table:
        out["robust_accuracy"] = float(table["robust_correct"].mean())
    return out


def make_objective(ctx: _Context, cached, worker: str):
    """The trial function; `objective.current` is the id of the trial it is running (for `give_back`)."""
    import optuna

    strategy, space = ctx.strategy, ctx.space
    minibatch = ctx.config.study.minibatch

    def objective(trial):
        objective.current = trial._trial_id
        trial.set_user_attr("worker_pidns", pid_namespace())  # first: the process that owns the trial (recover)
        trial.set_user_attr("worker", worker)
        prompt = space.suggest(trial, ctx.candidates, ctx.data.spec)
        trial.set_user_attr("exemplars", [ex.id for ex in prompt.exemplars])
        frames = []
        for start in range(0, len(ctx.dev), minibatch):
            batch = ctx.dev[start : start + minibatch]
            table = cached.score_table(prompt, batch)
            if strategy.needs_variants:
                table = _with_robust_correct(table, ctx.expand(cached, prompt, batch), cached)
            frames.append(table)
            if start == 0:
                fault_point("trial")
            if strategy.multi_objective:
                continue
            for offset, value in enumerate(strategy.item_values(table)):
                trial.report(float(value), step=start + offset)  # one step per dev item: paired pruning
            if start + minibatch < len(ctx.dev) and trial.should_prune():
                partial = pd.concat(frames, ignore_index=True)
                trial.set_user_attr("metrics", _trial_summary(partial))
                trial.set_user_attr("partial_value", float(strategy.item_values(partial).mean()))
                raise optuna.TrialPruned()  # Optuna keeps the last per-item report as the value; see partial_value
        full = pd.concat(frames, ignore_index=True)
        trial.set_user_attr("metrics", _trial_summary(full))
        values = strategy.values(full)
        return values if strategy.multi_objective else values[0]

    objective.current = None
    return objective


def _optimize(ctx: _Context, study, cached, progress, worker: str, note=None) -> None:
    """Run trials until the budget of finished (COMPLETE/PRUNED) trials is met.

    Before each trial, abandoned trials are failed and their parameters queued (`recover`); queued retries
    run first, even when the budget is met, so no started trial is lost. No new trial starts while the
    trials running elsewhere would meet the budget by themselves: this process waits for them to finish or
    to go stale (at most the grace period after their process died), then re-runs the stale ones."""
    study_config = ctx.config.study
    budget = study_config.trials
    objective = make_objective(ctx, cached, worker)
    callbacks = [progress] if progress else None
    waiting_since = None
    while True:
        recover(study, study_config.grace_period)
        done, running, waiting = counts(study)
        if not waiting and done >= budget:
            return
        if not waiting and done + running >= budget:
            if waiting_since is None and note is not None:
                note(f"waiting for {running} trial(s) running elsewhere to finish, or to go stale "
                     f"(at most {study_config.grace_period}s after their process died) and be re-run here")
            waiting_since = waiting_since or time.monotonic()
            time.sleep(min(2.0, study_config.heartbeat_interval))
            continue
        waiting_since = None
        objective.current = None
        try:
            study.optimize(objective, n_trials=1, callbacks=callbacks, gc_after_trial=False)
        except BaseException as exc:
            if not isinstance(exc, PromptTooLongError):  # a prompt too long would fail again
                give_back(study, objective.current)
            raise


def worker_main(config_dict: dict, factory, index: int, joined: bool, ready=None, errors=None, expand=None) -> None:
    """Entry point of a worker process: builds its own scorer from the factory (model, task data, the
    shared result cache), signals `ready`, and joins the study. A user error goes to `errors` (the parent
    reports it in one line); Ctrl-C exits quietly with status 130."""
    import transformers

    quiet_optuna()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the parent shows the progress
    config = SearchConfig.from_dict(config_dict)
    try:
        with storage_errors(config):
            cached = factory()
            ctx = _context(config, cached.task, expand)
            storage = make_storage(config)
            study = _open_study(config, ctx.strategy, storage, index=index, joined=joined, create=False)
            if ready is not None:
                ready.set()
            _optimize(ctx, study, cached, None, worker_name(index))
    except KeyboardInterrupt:
        sys.exit(130)
    except UserError as exc:
        if errors is not None:
            errors.put(f"worker {index}: {exc}")
        sys.exit(2)


@contextmanager
def _workers(config: SearchConfig, factory, joined: bool, expand=None):
    """Workers 1..n-1 as spawned processes, started together (each with its model loaded). On the way out
    they are joined; if this process stops early (Ctrl-C, an error) they are interrupted so each gives its
    trial back, then terminated if they do not stop."""
    n = config.study.n_workers
    spawn = multiprocessing.get_context("spawn")
    errors = spawn.Queue() if n > 1 else None
    ready = [spawn.Event() for _ in range(1, n)]
    procs = [spawn.Process(target=worker_main, args=(config.to_dict(), factory, i, joined, ready[i - 1], errors, expand)) for i in range(1, n)]
    for proc in procs:
        proc.start()
    ok = False
    try:
        while not all(event.is_set() for event in ready):
            if any(not proc.is_alive() and not event.is_set() for proc, event in zip(procs, ready)):
                break  # a worker died while loading; its exit code is reported below
            time.sleep(0.2)
        yield
        ok = True
    finally:
        if not ok:
            _interrupt(procs)
        for proc in procs:
            proc.join()
    failed = [proc.exitcode for proc in procs if proc.exitcode]
    if failed:
        message = errors.get(timeout=1) if errors is not None and not errors.empty() else None
        raise UserError(message or f"{len(failed)} worker process(es) failed (exit codes {failed}); see their output above")


def _interrupt(procs, grace: float = 5.0) -> None:
    """Stop workers early: a terminal's Ctrl-C reached them already, so give them a moment; then SIGINT (each
    fails and re-queues its trial), then SIGTERM for any that still does not stop."""
    import signal

    for sig in (None, signal.SIGINT, signal.SIGTERM):
        alive = [proc for proc in procs if proc.is_alive()]
        for proc in alive if sig is not None else ():
            os.kill(proc.pid, sig)
        deadline = time.monotonic() + grace
        for proc in alive:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))


# --- outputs -----------------------------------------------------------------------------------
def _write_table(frame: pd.DataFrame, path: Path) -> None:
    frame = frame.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            frame[column] = frame[column].map(lambda v: v if isinstance(v, (str, type(None))) else json.dumps(v, default=str))
    atomic_write_bytes_via(path.with_suffix(".parquet"), lambda p: frame.to_parquet(p, index=False))
    atomic_write_bytes_via(path.with_suffix(".csv"), lambda p: frame.to_csv(p, index=False))


def decode_params(config: SearchConfig, data, params: dict):
    """The Prompt a finished trial's parameters stand for, given the run's settings and task data."""
    return decode(_context(config, data, expand=lambda *args: []), params)


def decode(ctx: _Context, params: dict):
    """The Prompt a set of trial parameters stands for."""
    import optuna

    return ctx.space.suggest(optuna.trial.FixedTrial(params), ctx.candidates, ctx.data.spec)


def _note(show: bool):
    return (lambda text: print(f"note: {text}", file=sys.stderr, flush=True)) if show else None


def run_search(config: SearchConfig, *, scorer=None, data=None, expand=None, show_progress: bool = True) -> SearchResult:
    """Run (or resume) the study of `config` and write its run directory.

    `scorer`: a CachedScorer to use (an experiment session passes its own, so the model is loaded once);
    without one, the task data is loaded and checked first, then the model, with the result cache in the
    run directory. Worker processes (`n_workers` > 1) build their own scorer from a ScorerFactory.
    `expand`: perturbed variants of dev items for the `robust` strategy (promptopt.robustness.VariantExpander).
    `data`: the task data to search on, when it is not the scorer's own (e.g. a subset of its dev items:
    `diagnose conflicts` searches on the ambiguous questions only); single-worker runs only.

    Order: everything that can fail on input is checked before the first file or study row exists."""
    from promptopt.scoring import ScorerFactory

    quiet_optuna()
    out = Path(config.out)
    check_output(out, folder=True, what="--out")
    if data is not None and config.study.n_workers > 1:
        raise ConfigError("run_search(data=...): worker processes load the task's own data; use n_workers=1")
    data = data if data is not None else scorer.task if scorer is not None else config.data.load()
    ctx = _context(config, data, expand)  # task, space, strategy
    if scorer is None:
        config.model.check()  # the model resolves, the device exists, 4/8-bit has CUDA
    current = identity(ctx)
    with storage_errors(config):
        storage = _existing_storage(config)
        _check_study(config, storage, current)  # exists iff --resume; a resumed study means the same thing
    start = time.perf_counter()
    factory = ScorerFactory(model=config.model, data=config.data, cache_path=str(out / "cache.sqlite"), batch_size=config.batch_size)
    if scorer is None:  # a model or cache that fails to load fails here, before anything is written
        scorer = factory.build(data)
    else:
        factory = ScorerFactory(model=config.model, data=config.data, cache_path=str(scorer.cache.path), batch_size=config.batch_size)
    check_prompts_fit(ctx, scorer)
    with storage_errors(config):
        storage = storage or make_storage(config)
        return _run(ctx, storage, scorer, factory, current, start, show_progress)


def _run(ctx: _Context, storage, cached, factory, current: dict, start: float, show_progress: bool) -> SearchResult:
    """The study, its workers and the run directory, once everything is validated."""
    from tqdm.auto import tqdm

    config, out = ctx.config, Path(ctx.config.out)
    joined = config.study.resume
    hits_before, misses_before = cached.cache.hits, cached.cache.misses
    study = _open_study(config, ctx.strategy, storage, index=0, joined=joined, create=not joined, current=current)
    scrub_stored_config(study)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(config.public_dict(), indent=1))
    atomic_write_text(out / "splits.json", json.dumps(ctx.data.carving(), indent=1))
    budget = config.study.trials
    bar = tqdm(total=budget, initial=min(counts(study)[0], budget), desc=f"search {config.name}", disable=not show_progress)

    def progress(study_, trial_):
        bar.n = min(counts(study_)[0], budget)
        if not ctx.strategy.multi_objective:
            try:
                bar.set_postfix(best=f"{study_.best_value:.4f}", trial=study_.best_trial.number)
            except ValueError:
                pass
        bar.refresh()

    try:
        with _workers(config, factory, joined, ctx.expand):  # this process is worker 0; its model is loaded anyway
            _optimize(ctx, study, cached, progress, worker_name(0), note=_note(show_progress))
        progress(study, None)
    finally:
        bar.close()
    wall = time.perf_counter() - start
    result = _write_outputs(ctx, study, cached, wall, hits_before, misses_before)
    _report_leftovers(study, show_progress)
    return result


def _write_outputs(ctx: _Context, study, cached, wall: float, hits_before: int, misses_before: int) -> SearchResult:
    """trials table, winner re-scored on dev and test, card and summary: each file written atomically."""
    from promptopt.prompts import save_card
    from promptopt.scoring import summarize

    config, out = ctx.config, Path(ctx.config.out)
    trials = study.trials_dataframe(attrs=("number", "value" if not ctx.strategy.multi_objective else "values", "state", "params", "user_attrs", "duration"))
    _write_table(trials, out / "trials")
    pareto = None
    if ctx.strategy.multi_objective:
        front = study.best_trials
        pareto = pd.DataFrame([{"number": t.number, "accuracy": t.values[0], "signed_stability": t.values[1], **t.params} for t in front])
        _write_table(pareto, out / "pareto_front")
    candidates = _candidates(study, ctx.strategy)
    winner, selection = select_winner(ctx.strategy, candidates)
    best = next(t for t in study.trials if t.number == winner["number"])
    prompt = decode(ctx, best.params)
    fault_point("rescore")
    dev_table = cached.score_table(prompt, ctx.dev)
    test_table = cached.score_table(prompt, ctx.test)
    dev, test = summarize(dev_table), summarize(test_table)
    _write_table(test_table, out / "best_test_items")
    fault_point("card")
    provenance = {
        "task": ctx.data.spec.name,
        "model": config.model.spec,
        "strategy": config.study.strategy,
        "study": config.name,
        "trial": best.number,
        "selection": selection,
        "seed": config.study.seed,
        "dev": {k: dev[k] for k in ("n", "accuracy", "tcb_mean", "tcb_geomean", "ppl_mean")},
        "test": {k: test[k] for k in ("n", "accuracy", "tcb_mean", "tcb_geomean", "ppl_mean")},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    card_path = out / "best_card.yaml"
    save_card(prompt, card_path, provenance)
    hits, misses = cached.cache.hits - hits_before, cached.cache.misses - misses_before
    hit_rate = hits / (hits + misses) if hits + misses else float("nan")
    result = SearchResult(config, trials, best.params, best.number, prompt, dev, test, card_path, wall, hit_rate, pareto,
                          selection=selection, ranking=_ranking(ctx.strategy, candidates, winner))
    for entry in result.ranking:
        entry["prompt"] = decode(ctx, entry["params"])
    summary = {"study": config.name, "storage": redact(config.storage_url), "best_trial": best.number, "best_params": best.params,
               "selection": selection,
               "dev": dev, "test": test, "wall_seconds": wall, "cache_hit_rate": result.cache_hit_rate,
               "trials": {s: int((trials["state"] == s).sum()) for s in trials["state"].unique()}}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))
    return result


def _candidates(study, strategy) -> list[dict]:
    """Finished trials as the selection rule sees them (the Pareto front for multi-objective studies)."""
    from optuna.trial import TrialState

    trials = study.best_trials if strategy.multi_objective else study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    out = []
    for t in trials:
        metrics = t.user_attrs.get("metrics", {})
        out.append({"number": t.number, "params": t.params, "value": t.value if not strategy.multi_objective else None,
                    "values": t.values, "accuracy": metrics.get("accuracy", float("nan")), "n": metrics.get("n", 0),
                    "signed_stability": metrics.get("signed_stability", float("-inf"))})
    return out


def _ranking(strategy, candidates: list[dict], winner: dict) -> list[dict]:
    """Trials in the order the strategy prefers them (the winner first, then by the same rule), one per
    distinct prompt: what `compare --top-n` evaluates."""
    rest = [c for c in candidates if c["number"] != winner["number"]]
    ranked = [winner]
    while rest:
        nxt, _ = select_winner(strategy, rest)
        ranked.append(nxt)
        rest = [c for c in rest if c["number"] != nxt["number"]]
    seen, distinct = set(), []
    for c in ranked:
        key = json.dumps(c["params"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            distinct.append(c)
    return distinct


def _report_leftovers(study, show: bool) -> None:
    """Trials still RUNNING when the budget is met belong to other processes: alive ones finish by
    themselves; if their process died, the next --resume re-runs them (after the grace period)."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if running and show:
        names = ", ".join(f"#{t.number} ({t.user_attrs.get('worker', '?')})" for t in running)
        _note(True)(f"trial(s) {names} still RUNNING elsewhere; if their process died, --resume re-runs them")


def dashboard_command(config: SearchConfig) -> str:
    return f"optuna-dashboard {redact(config.storage_url)}"


__all__ = ["SearchResult", "check_search", "dashboard_command", "make_storage", "redact", "run_search", "worker_main"]
