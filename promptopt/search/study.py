"""`promptopt search`: one Optuna study over instructions × exemplar sets × orders × templates.

Everything a run needs is validated before the study exists (task, space, strategy, storage), so a run
that never starts writes no study rows. Storage is any Optuna RDB URL (SQLite file in the run directory by
default; PostgreSQL for many workers). Trials carry a heartbeat: a trial left RUNNING by a killed process
is marked FAIL by the next worker and its parameters are enqueued again, so nothing is lost, and only
COMPLETE/PRUNED trials count towards the budget, so nothing is counted twice.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.errors import ConfigError, UserError
from promptopt.prompts import Prompt
from promptopt.search.config import SearchConfig
from promptopt.search.objectives import Strategy, get_strategy, select_winner
from promptopt.search.space import SearchSpace, load_space
from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text


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


def redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]+@", r"://\1:***@", url)


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


def make_storage(config: SearchConfig):
    """An RDBStorage with heartbeat and retry of stale trials; unreachable URLs become one clear error."""
    from optuna import storages

    url = config.storage_url
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    retry_cls = getattr(storages, "RetryHeartbeatStaleTrialCallback", None) or storages.RetryFailedTrialCallback
    callback_kw = "heartbeat_stale_trial_callback" if hasattr(storages, "RetryHeartbeatStaleTrialCallback") else "failed_trial_callback"
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    try:
        return storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=config.study.heartbeat_interval,
            grace_period=config.study.grace_period,
            **{callback_kw: retry_cls(max_retry=3)},
        )
    except Exception as exc:  # any failure to open a user-given URL is the URL's problem
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {redact(url)}: {first}") from None


def _sampler(config: SearchConfig, strategy: Strategy, worker: int, offset: int):
    from optuna.samplers import NSGAIISampler, TPESampler

    study = config.study
    seed = study.seed + 1000 * worker + offset  # a resumed or parallel worker must not replay trial 0
    if strategy.multi_objective:
        return NSGAIISampler(seed=seed, population_size=max(4, min(50, study.trials // 3)))
    return TPESampler(seed=seed, n_startup_trials=max(1, min(10, study.trials // 3)), multivariate=True, group=True)


def _pruner(config: SearchConfig, strategy: Strategy):
    from optuna.pruners import NopPruner, WilcoxonPruner

    if not config.study.pruning or strategy.multi_objective:
        return NopPruner()
    return WilcoxonPruner(p_threshold=0.1, n_startup_steps=config.study.minibatch)


def _study_exists(config: SearchConfig, storage) -> int | None:
    """Number of trials in the named study, or None when it does not exist."""
    import optuna

    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name == config.name:
            return summary.n_trials
    return None


def _check_study(config: SearchConfig, storage) -> None:
    exists = _study_exists(config, storage) is not None
    if exists and not config.study.resume:
        raise UserError(
            f"study '{config.name}' already exists in {redact(config.storage_url)}: pass --resume to continue it, "
            "or choose another --out / --study-name"
        )
    if not exists and config.study.resume:
        raise UserError(f"--resume: no study '{config.name}' in {redact(config.storage_url)}")


def _open_study(config: SearchConfig, strategy: Strategy, storage, *, worker: int = 0):
    import optuna

    n_existing = _study_exists(config, storage)
    study = optuna.create_study(
        study_name=config.name,
        storage=storage,
        directions=list(strategy.directions),
        sampler=_sampler(config, strategy, worker, n_existing or 0),
        pruner=_pruner(config, strategy),
        load_if_exists=True,
    )
    if n_existing is None:
        study.set_metric_names(["accuracy", "signed_stability"] if strategy.multi_objective else [strategy.name])
        study.set_user_attr("config", json.dumps(config.to_dict()))
    return study


# --- the objective -------------------------------------------------------------------------------
def _trial_summary(table: pd.DataFrame) -> dict:
    from promptopt.scoring import summarize

    from promptopt.search.objectives import signed_stability

    s = summarize(table)
    keys = ("accuracy", "tcb_mean", "tcb_median", "tcb_geomean", "v_eff_mean", "ppl_mean", "n")
    out = {k: s[k] for k in keys if k in s}
    out["signed_stability"] = float(signed_stability(table).mean())
    if "robust_correct" in table:
        out["robust_accuracy"] = float(table["robust_correct"].mean())
    out["answer_nll_mean"] = float(table["answer_nll"].mean()) if "answer_nll" in table else float("nan")
    return out


def make_objective(ctx: _Context, cached, worker: int = 0):
    import optuna

    strategy, space = ctx.strategy, ctx.space
    minibatch = ctx.config.study.minibatch

    def objective(trial):
        prompt = space.suggest(trial, ctx.candidates, ctx.data.spec)
        trial.set_user_attr("exemplars", [ex.id for ex in prompt.exemplars])
        trial.set_user_attr("worker", worker)
        frames = []
        for start in range(0, len(ctx.dev), minibatch):
            batch = ctx.dev[start : start + minibatch]
            table = cached.score_table(prompt, batch)
            if strategy.needs_variants:
                table = _with_robust_correct(table, ctx.expand(cached, prompt, batch), cached)
            frames.append(table)
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

    return objective


def _count_done(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _optimize(ctx: _Context, study, cached, progress, worker: int = 0) -> None:
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    if _count_done(study) >= ctx.config.study.trials:
        return
    stop = MaxTrialsCallback(ctx.config.study.trials, states=(TrialState.COMPLETE, TrialState.PRUNED))
    callbacks = [stop] + ([progress] if progress else [])
    study.optimize(make_objective(ctx, cached, worker), n_trials=None, callbacks=callbacks, gc_after_trial=False)


def worker_main(config_dict: dict, factory, worker: int, ready=None, expand=None) -> None:
    """Entry point of a worker process: builds its own scorer from the factory (model, task data, the
    shared result cache), signals `ready`, and joins the study."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    config = SearchConfig.from_dict(config_dict)
    cached = factory()
    ctx = _context(config, cached.task, expand)
    storage = make_storage(config)
    study = _open_study(config, ctx.strategy, storage, worker=worker)
    if ready is not None:
        ready.set()
    _optimize(ctx, study, cached, None, worker)


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


def run_search(config: SearchConfig, *, scorer=None, expand=None, show_progress: bool = True) -> SearchResult:
    """Run (or resume) the study of `config` and write its run directory.

    `scorer`: a CachedScorer to use (an experiment session passes its own, so the model is loaded once);
    without one, the task data is loaded and checked first, then the model, with the result cache in the
    run directory. Worker processes (`n_workers` > 1) build their own scorer from a ScorerFactory."""
    import optuna
    from tqdm.auto import tqdm

    from promptopt.prompts import save_card
    from promptopt.scoring import ScorerFactory, summarize

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = Path(config.out)
    data = scorer.task if scorer is not None else config.data.load()
    ctx = _context(config, data, expand)  # validates task, space, strategy before any storage is touched
    storage = make_storage(config)
    _check_study(config, storage)
    start = time.perf_counter()
    if scorer is None:  # a model that fails to load fails here, before any study row exists
        scorer = ScorerFactory(model=config.model, data=config.data, cache_path=str(out / "cache.sqlite"),
                               batch_size=config.batch_size).build(data)
    cached = scorer
    hits_before, misses_before = cached.cache.hits, cached.cache.misses
    study = _open_study(config, ctx.strategy, storage)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.json", json.dumps(config.to_dict(), indent=1))
    atomic_write_text(out / "splits.json", json.dumps(ctx.data.carving(), indent=1))
    trials_budget = config.study.trials
    bar = tqdm(total=trials_budget, initial=min(_count_done(study), trials_budget), desc=f"search {config.name}", disable=not show_progress)

    def progress(study_, trial_):
        bar.n = min(_count_done(study_), trials_budget)
        if not ctx.strategy.multi_objective:
            try:
                bar.set_postfix(best=f"{study_.best_value:.4f}", trial=study_.best_trial.number)
            except ValueError:
                pass
        bar.refresh()

    # This process is worker 0 (its model is loaded anyway, for the final evaluation); the others are spawned.
    spawn = multiprocessing.get_context("spawn")
    n_workers = config.study.n_workers
    factory = ScorerFactory(model=config.model, data=config.data, cache_path=str(cached.cache.path), batch_size=config.batch_size)
    ready = [spawn.Event() for _ in range(1, n_workers)]
    workers = [spawn.Process(target=worker_main, args=(config.to_dict(), factory, i, ready[i - 1], expand)) for i in range(1, n_workers)]
    for proc in workers:
        proc.start()
    while not all(event.is_set() for event in ready):  # start together: every worker has its model loaded
        if any(not proc.is_alive() and not event.is_set() for proc, event in zip(workers, ready)):
            break  # a worker died while loading; its exit code is reported below
        time.sleep(0.2)
    _optimize(ctx, study, cached, progress)
    for proc in workers:
        proc.join()
    failed = [proc.exitcode for proc in workers if proc.exitcode]
    if failed:
        raise UserError(f"{len(failed)} worker process(es) failed (exit codes {failed}); see their output above")
    progress(study, None)
    bar.close()
    wall = time.perf_counter() - start

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
    dev_table = cached.score_table(prompt, ctx.dev)
    test_table = cached.score_table(prompt, ctx.test)
    dev, test = summarize(dev_table), summarize(test_table)
    _write_table(test_table, out / "best_test_items")
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


def dashboard_command(config: SearchConfig) -> str:
    return f"optuna-dashboard {config.storage_url}"


__all__ = ["SearchResult", "check_search", "dashboard_command", "make_storage", "run_search", "worker_main"]
