"""Where a study lives and how it samples: the Optuna RDB storage (SQLite in the run directory by default,
PostgreSQL for many workers), each worker's sampler seed, the sampler, the pruner, and Optuna's logging."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import warnings

from promptopt.errors import StorageError, UserError
from promptopt.search.config import SearchConfig, redact, sqlite_path
from promptopt.search.recovery import first_line, retry_callback, storage_cause
from promptopt.search.strategies import Strategy


def make_storage(config: SearchConfig):
    """An RDBStorage with heartbeat and retry of stale trials; unreachable URLs become one clear error."""
    from optuna import storages

    url = config.storage_url
    if sqlite_path(url) is not None:
        sqlite_path(url).parent.mkdir(parents=True, exist_ok=True)
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


def existing_storage(config: SearchConfig):
    """The storage if it may hold the study; None for an SQLite file that does not exist yet (it is created
    with the study, so a run that fails validation leaves no empty study.db)."""
    path = sqlite_path(config.storage_url)
    if path is not None and not path.exists():
        return None
    return make_storage(config)


def stored_study(config: SearchConfig, storage):
    """The named study's summary, or None."""
    import optuna

    if storage is None:
        return None
    return next((s for s in optuna.get_all_study_summaries(storage, include_best_trial=False) if s.study_name == config.name), None)


def worker_seed(seed: int, index: int, *, joined: bool, n_existing: int = 0) -> int:
    """The sampler seed of one worker. In the run that creates the study, worker 0 uses `seed` itself and
    worker i a seed derived from (seed, i), so a single-worker run is reproducible. A process that joins an
    existing study (--resume, another machine) derives it from (seed, host, pid, i, trials so far), so
    processes that join together never sample the same points."""
    if not joined and index == 0:
        return seed
    parts = [seed, index] + ([socket.gethostname(), os.getpid(), n_existing] if joined else [])
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:4], "little")


def sampler(config: SearchConfig, strategy: Strategy, seed: int):
    from optuna.samplers import NSGAIISampler, TPESampler

    trials = config.study.trials
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if strategy.multi_objective:
            return NSGAIISampler(seed=seed, population_size=max(4, min(50, trials // 3)))
        return TPESampler(seed=seed, n_startup_trials=max(1, min(10, trials // 3)), multivariate=True, group=True)


def pruner(config: SearchConfig, strategy: Strategy):
    from optuna.pruners import NopPruner, WilcoxonPruner

    if not config.study.pruning or strategy.multi_objective:
        return NopPruner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return WilcoxonPruner(p_threshold=0.1, n_startup_steps=config.study.minibatch)


def open_study(config: SearchConfig, strategy: Strategy, storage, *, index: int, joined: bool, create: bool,
                current: dict | None = None):
    """Create the study (recording its public config and identity) or load it, with this worker's sampler."""
    import optuna

    n_existing = len(optuna.load_study(study_name=config.name, storage=storage).trials) if not create else 0
    the_sampler = sampler(config, strategy, worker_seed(config.study.seed, index, joined=joined, n_existing=n_existing))
    if not create:
        return optuna.load_study(study_name=config.name, storage=storage, sampler=the_sampler, pruner=pruner(config, strategy))
    try:
        study = optuna.create_study(study_name=config.name, storage=storage, directions=list(strategy.directions),
                                    sampler=the_sampler, pruner=pruner(config, strategy))
    except optuna.exceptions.DuplicatedStudyError:
        raise UserError(f"study '{config.name}' was just created by another process: pass --resume to join it") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.set_metric_names(["accuracy", "signed_stability"] if strategy.multi_objective else [strategy.name])
    study.set_user_attr("config", json.dumps(config.public_dict()))
    study.set_user_attr("identity", json.dumps(current))
    return study


def dashboard_command(config: SearchConfig) -> str:
    return f"optuna-dashboard {redact(config.storage_url)}"


class _FailedTrialLog(logging.Filter):
    """Optuna logs each failed trial with its traceback, then re-raises the error to us; the CLI reports
    that error in one line, so the log would only repeat it as a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Trial ") and " failed with " in message)


def _heartbeat_hook(previous):
    def hook(args):  # Optuna's heartbeat thread dies with the storage; the main thread reports that once
        if "_record_heartbeat" in getattr(args.thread, "name", "") and storage_cause(args.exc_value) is not None:
            return
        previous(args)

    hook.promptopt = True
    return hook


def quiet_optuna() -> None:
    """Optuna at WARNING, without the failed-trial tracebacks and heartbeat-thread tracebacks that repeat
    the error the run reports itself."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logger = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _FailedTrialLog) for f in logger.filters):
        logger.addFilter(_FailedTrialLog())
    if not getattr(threading.excepthook, "promptopt", False):
        threading.excepthook = _heartbeat_hook(threading.excepthook)
