"""Where a study lives and how it samples: the Optuna RDB storage (SQLite in the run directory by default,
PostgreSQL for many workers), each worker's sampler seed, the sampler, the pruner, and Optuna's logging."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import warnings
from pathlib import Path

from promptopt.errors import StorageError, UserError
from promptopt.study.config import SearchConfig, redact, sqlite_path
from promptopt.study.recovery import fault_point, first_line, retry_callback, storage_cause
from promptopt.study.strategies import Strategy
from promptopt.yamlio import cannot_write


def make_storage(config: SearchConfig, *, write: bool = True):
    """An RDBStorage with heartbeat and retry of stale trials; unreachable URLs become one clear error.
    `write`: the caller will write to the study (a search, or the checks before one): an SQLite file that
    cannot be written is refused before SQLite opens it (see `check_writable`)."""
    import time

    from optuna import storages
    from sqlalchemy import event

    url = config.storage_url
    path = sqlite_path(url)
    if path is not None:
        if write:
            check_writable(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(path.parent, exc) from None
    engine_kwargs = {"creator": lambda: _sqlite_connection(path)} if path is not None else {"pool_pre_ping": True}
    callback_kw = (
        "heartbeat_stale_trial_callback"
        if hasattr(storages, "RetryHeartbeatStaleTrialCallback")
        else "failed_trial_callback"
    )
    fault_point("storage-schema")  # a new run: its study.db claimed, Optuna's tables not made yet
    for attempt in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeat and the retry callback are "experimental" in Optuna
            try:
                storage = storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=config.study.heartbeat_interval,
                    grace_period=config.study.grace_period,
                    **{callback_kw: retry_callback()(max_retry=3)},
                )
                if path is not None:
                    event.listen(storage.engine, "begin", _begin_immediate)
                return storage
            except Exception as exc:  # any failure to open a user-given URL is the URL's problem
                if attempt == 1 and _schema_race(exc):  # another process set the schema up at the same moment
                    time.sleep(0.5)
                    continue
                raise StorageError(f"cannot open storage {redact(url)}: {first_line(exc, url)}") from None


def _sqlite_connection(path):
    """A connection to the study's SQLite file in WAL mode with synchronous=NORMAL. Optuna commits every
    suggest, report and user attribute on its own (~60 commits a trial); in SQLite's default rollback-journal
    mode each commit waits for several fsyncs (12 ms here, ~0.8 s a trial), in WAL with NORMAL for none.
    A killed process loses nothing that was committed; a power cut may lose the last commits (trials that
    --resume runs again), never the file. As for the result cache (WAL too): on read-only media, copy the run
    directory before reading it."""
    # check_same_thread: Optuna's heartbeat thread and the trial use one pool (SQLAlchemy serializes them)
    conn = sqlite3.connect(path, timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def check_writable(path: Path) -> None:
    """An existing SQLite study file that this process may not write (chmod a-w as another user, a read-only
    mount) is one StorageError, raised before SQLite opens it: SQLite would open it read-only without a word,
    leave new -wal / -shm files beside it, and fail at the first trial's write."""
    if path.exists() and not os.access(path, os.W_OK):
        raise StorageError(
            f"{path.name} is read-only: {path} cannot be written, and a search records its trials there; make it "
            "writable, or copy the run directory and run --resume on the copy"
        )


def fold_wal(config: SearchConfig) -> bool:
    """Fold an SQLite study's write-ahead log back into its file, once this process has closed its own
    connections (the storage's engine disposed), and check that it happened: PRAGMA wal_checkpoint(TRUNCATE).

    Until then the newest rows live in `study.db-wal`; `study.db` alone is the whole study only after this.
    SQLite tries the same when its last connection closes, but says nothing when it fails (a full disk cannot
    grow the file, an I/O error), and a run that ended that way once reported success over a study.db that
    alone was "malformed". A failure is one StorageError: nothing is lost (the file and its -wal together
    hold the study, and --resume continues it; keep both). True when folded, or nothing to fold (not SQLite,
    no file, no log left: the last connection to close folded it); False when another process still has the
    study open (it folds the log when it closes)."""
    path = sqlite_path(config.storage_url)
    log = path.with_name(path.name + "-wal") if path is not None else None
    if path is None or not path.exists() or not log.exists() or log.stat().st_size == 0:
        return True
    try:
        busy = _checkpoint(path)
    except sqlite3.Error as exc:
        reason = first_line(exc)
        then = "free some space and" if "full" in reason else "once the disk can be written again,"
        raise StorageError(
            f"cannot fold the write-ahead log into {path} ({reason}): {path.name} alone is not the study yet, "
            f"{log.name} holds its newest trials (keep both); {then} run again with --resume"
        ) from None
    return not busy


def _checkpoint(path: Path) -> int:
    """PRAGMA wal_checkpoint(TRUNCATE) on the existing file (never created here) -> its `busy` flag: 1 when
    another connection kept it from completing. Errors (SQLITE_FULL, SQLITE_IOERR...) are raised."""
    uri = path.resolve().as_uri() + "?mode=rw"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=2)) as conn:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return busy


def _begin_immediate(connection) -> None:
    """Begin each transaction on the study's SQLite file with BEGIN IMMEDIATE (the write lock at once).

    Optuna claims a queued trial by reading its state and setting it RUNNING if it was WAITING
    (`set_trial_state_values`), with SELECT ... FOR UPDATE, which SQLite ignores. In the driver's deferred
    transactions the read takes no lock: two processes joining a study at the same moment both read
    WAITING, both set RUNNING and both run the same queued trial (the later one then fails with "Cannot
    tell a COMPLETE trial"). Failing an abandoned trial is the same read then write: two processes
    recovering at once both failed it and queued its retry twice. Holding the write lock from the start
    makes the read and the write one step, as the row lock does on PostgreSQL. Optuna's transactions are
    short: 60 trials of 26 writes each took 4.2-5.1 s with it and 3.9-5.3 s without (three runs each).
    Set once the storage is built: Optuna's schema set-up holds one connection while it opens another."""
    dbapi = connection.connection.dbapi_connection
    if dbapi.isolation_level is not None:
        dbapi.isolation_level = None  # the driver begins nothing of its own; no transaction is open here
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _schema_race(exc: BaseException) -> bool:
    text = str(exc)
    return "alembic_version" in text or "already exists" in text or "UNIQUE constraint failed" in text


def claim_sqlite_file(config: SearchConfig) -> None:
    """Create the run's new SQLite file exclusively (O_EXCL): of two runs started at the same instant on one
    --out, the second is told to --resume instead of colliding in Optuna's schema set-up."""
    path = sqlite_path(config.storage_url)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    except FileExistsError:
        raise UserError(
            f"study '{config.name}' already exists in {redact(config.storage_url)} (another run created it just "
            "now): pass --resume to continue it, or choose another --out / --study-name"
        ) from None
    except OSError as exc:
        raise cannot_write(path, exc) from None


def remove_new_sqlite(config: SearchConfig, storage) -> bool:
    """Delete the SQLite file this run created (and its journal), when no trial of it has finished: a run
    that failed before its first trial leaves no half-built study.db behind."""
    import optuna
    from optuna.trial import TrialState

    path = sqlite_path(config.storage_url)
    try:
        if storage is not None:
            studies = optuna.get_all_study_summaries(storage, include_best_trial=False)
            for summary in studies:
                trials = storage.get_all_trials(
                    summary._study_id, deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)
                )
                if trials:
                    return False  # finished work: --resume continues from it
            storage.engine.dispose()
    except Exception:  # the file is unreadable (a half-built schema): nothing in it to keep
        if storage is not None:
            storage.engine.dispose()
    for name in (path.name, path.name + "-journal", path.name + "-wal", path.name + "-shm"):
        (path.parent / name).unlink(missing_ok=True)
    return True


@contextlib.contextmanager
def existing_storage(config: SearchConfig, *, write: bool = True):
    """The storage, to look into, if it may hold the study; None for an SQLite file that does not exist yet (it
    is created with the study, so a run that fails validation leaves no empty study.db). Closed afterwards: a
    look that refuses a resume leaves the run directory as it found it (no -wal / -shm files). `write`: the look
    comes before a run that writes to the study (see `make_storage`)."""
    path = sqlite_path(config.storage_url)
    storage = None if path is not None and not path.exists() else make_storage(config, write=write)
    try:
        yield storage
    finally:
        if storage is not None:
            storage.engine.dispose()


def read_study(config: SearchConfig, *, where: str):
    """The stored study copied into memory, for commands that only read it (export, report, proxy). The storage is
    closed at once: a reader leaves no -wal / -shm beside study.db and holds no database connection. A missing
    SQLite file or study is one error naming `where` (the file is never created)."""
    import optuna

    quiet_optuna()  # copy_study announces the in-memory study at INFO
    with existing_storage(config, write=False) as storage:
        if storage is None:
            raise UserError(f"{where}: study storage {sqlite_path(config.storage_url)} is missing")
        memory = optuna.storages.InMemoryStorage()
        try:
            optuna.copy_study(from_study_name=config.name, from_storage=storage, to_storage=memory)
        except KeyError:
            raise UserError(f"{where}: no study '{config.name}' in its storage") from None
    return optuna.load_study(study_name=config.name, storage=memory)


def stored_study(config: SearchConfig, storage):
    """The named study's summary, or None."""
    import optuna

    if storage is None:
        return None
    return next(
        (s for s in optuna.get_all_study_summaries(storage, include_best_trial=False) if s.study_name == config.name),
        None,
    )


def worker_seed(seed: int, index: int) -> int:
    """The base sampler seed of one worker: worker 0 (every single-worker run, and each process that joins
    with --resume) uses `seed` itself, worker i of a run a seed derived from (seed, i). Processes that
    join together still sample different points: each trial's seed also depends on its ordinal
    (`TrialSeeded`), which no two live trials share."""
    if index == 0:
        return seed
    return _derive(seed, index)


def _derive(*parts) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(list(parts)).encode()).digest()[:4], "little")


def sampling_state(study, trial) -> tuple[int, bool]:
    """(ordinal, after a duplicate) of a trial. The ordinal is its place in the study's sequence of sampled
    points: the trials created before it that are not retries. A retry (Optuna's `retry_history`) re-runs the
    point of the trial it replaces and takes that trial's ordinal, so a resumed run gets the ordinals the
    uninterrupted run used, and no two live trials share one even when a trial fails after others started (several
    workers: counting the trials that had not failed gave a retry the ordinal of a trial started meanwhile).
    A prompt skipped as a duplicate (`duplicate_of`) counts, and the trial after it samples at random."""
    trials = study.get_trials(deepcopy=False)
    me = next((t for t in trials if t.number == trial.number), None)
    history = me.system_attrs.get("retry_history") if me is not None else None
    if history:
        original = next((t for t in trials if t.number == history[0]), None)
        if original is not None:
            return sampling_state(study, original)
    before = [t for t in trials if t.number < trial.number and not t.system_attrs.get("retry_history")]
    return len(before), bool(before) and "duplicate_of" in before[-1].user_attrs


def _trial_seeded():
    from optuna.samplers import BaseSampler, RandomSampler

    class TrialSeeded(BaseSampler):
        """A sampler rebuilt before each trial with a seed from (seed, the trial's ordinal). Optuna's samplers
        are deterministic given the study's finished trials and their seed, so the point a trial samples does
        not depend on how many processes sampled before it: a kill and --resume continue the uninterrupted
        run's stream, and a retry of a trial killed before it stored its parameters samples the same ones.

        After a sample that decoded to an evaluated prompt the next one is drawn at random: a skipped
        duplicate is not in TPE's history, so TPE would propose the same point again."""

        def __init__(self, make, seed: int) -> None:
            self._make, self._seed = make, seed
            self._inner = make(seed)

        def infer_relative_search_space(self, study, trial):
            return self._inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study, trial, search_space):
            return self._inner.sample_relative(study, trial, search_space)

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self._inner.sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study, trial) -> None:
            ordinal, after_duplicate = sampling_state(study, trial)
            seed = _derive(self._seed, ordinal)
            self._inner = RandomSampler(seed=seed) if after_duplicate else self._make(seed)
            self._inner.before_trial(study, trial)

        def after_trial(self, study, trial, state, values) -> None:
            self._inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self._inner.reseed_rng()

    return TrialSeeded


def sampler(config: SearchConfig, strategy: Strategy, seed: int):
    """TPE (NSGA-II for multi-objective strategies), seeded per trial (see `TrialSeeded`)."""
    from optuna.samplers import NSGAIISampler, TPESampler

    trials = config.study.trials

    def make(trial_seed: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if strategy.multi_objective:
                return NSGAIISampler(seed=trial_seed, population_size=max(4, min(50, trials // 3)))
            return TPESampler(
                seed=trial_seed, n_startup_trials=max(1, min(10, trials // 3)), multivariate=True, group=True
            )

    return _trial_seeded()(make, seed)


def pruner(config: SearchConfig, strategy: Strategy, n_items: int):
    """The racing pruner over `n_items` dev items (study/racing.py), or none (pruning off, multi-objective)."""
    from optuna.pruners import NopPruner

    from promptopt.study.racing import racing_pruner

    if not config.study.pruning or strategy.multi_objective:
        return NopPruner()
    return racing_pruner(n_items=n_items, first=config.study.minibatch, futility=not strategy.multi_fidelity)


def open_study(
    config: SearchConfig,
    strategy: Strategy,
    storage,
    *,
    index: int,
    create: bool,
    n_items: int,
    current: dict | None = None,
):
    """Create the study (recording its public config and identity) or load it, with this worker's sampler and a
    pruner racing trials over the `n_items` dev items."""
    import optuna

    the_sampler = sampler(config, strategy, worker_seed(config.study.seed, index))
    if not create:
        return optuna.load_study(
            study_name=config.name, storage=storage, sampler=the_sampler, pruner=pruner(config, strategy, n_items)
        )
    try:
        study = optuna.create_study(
            study_name=config.name,
            storage=storage,
            directions=list(strategy.directions),
            sampler=the_sampler,
            pruner=pruner(config, strategy, n_items),
        )
    except optuna.exceptions.DuplicatedStudyError:
        raise UserError(
            f"study '{config.name}' was just created by another process: pass --resume to join it"
        ) from None
    fault_point("study-row")  # the study's row made, what it is not recorded yet (`identity.half_created`)
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
