"""What happens when a run does not end normally: who owns a trial, abandoned trials and their retries,
a lost storage, Ctrl-C, and the fault-injection hook the tests use.

Every trial records its owner (`worker` = host:pid:index, and `worker_pidns`). A trial whose process can
no longer finish it is FAILed and its parameters are queued again through the storage's retry callback
(Optuna's RetryHeartbeatStaleTrialCallback, at most 3 retries per trial); `recover` says when a trial
counts as abandoned, `give_back` handles the trial this process was running when it stopped.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import sys
import time
import warnings
from contextlib import contextmanager

from promptopt.errors import StorageError, UserError
from promptopt.study.config import SearchConfig, redact, redact_text

FAULT_ENV = "PROMPTOPT_FAULT_SLEEP"
FAULT_WORKER_ENV = "PROMPTOPT_FAULT_WORKER"  # only this worker index stops there (unset: any process)


_FAULT_SEEN: dict[str, int] = {}
_WORKER_INDEX = 0


def as_worker(index: int) -> None:
    """This process is worker `index` of its run (workers.worker_main): what PROMPTOPT_FAULT_WORKER selects."""
    global _WORKER_INDEX
    _WORKER_INDEX = index


def fault_point(phase: str) -> None:
    """Test hook for tests/workflows/test_faults.py: with PROMPTOPT_FAULT_SLEEP=<phase>:<seconds>[:<n>] the run
    announces `fault-point <phase>` on stderr and sleeps there (the n-th time it gets there, default the
    first), so a test can kill it at a known point. Phases: ask (a trial started, before its parameters are
    sampled), trial (after a trial's first minibatch), rescore (before the winner is re-scored), card (after
    the trials table, before the card and summary); compare-search (before a compare's next study),
    compare-test (before a prompt's test scoring), compare-robust (before its robustness evaluation);
    create-storage (a new run, checked, about to create its study's storage); storage-schema (each time a
    storage is opened: in a new run, its study.db claimed and empty); study-row (Optuna made the new study's row,
    its config and identity not recorded yet); checkpoint (the run's
    outputs written, its storage about to be closed and SQLite's write-ahead log folded into study.db);
    incumbent (the incumbent scored, its trial not added yet); scan (the scan done, its record not stored yet);
    search-table-write / compare-table-write (a table's temporary file made, nothing in it yet) and
    search-tables / compare-tables (after each file of the run's table set is in place: study/tableset.py).
    With PROMPTOPT_FAULT_WORKER=<i> only worker i of a --n-workers run stops (the announcement names its pid)."""
    name, _, rest = os.environ.get(FAULT_ENV, "").partition(":")
    if name != phase or os.environ.get(FAULT_WORKER_ENV, str(_WORKER_INDEX)) != str(_WORKER_INDEX):
        return
    seconds, _, nth = rest.partition(":")
    _FAULT_SEEN[phase] = _FAULT_SEEN.get(phase, 0) + 1
    if _FAULT_SEEN[phase] == int(nth or 1):
        print(f"fault-point {phase} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(float(seconds or 0))


# --- who runs a trial ------------------------------------------------------------------------------
def worker_name(index: int) -> str:
    """host:pid:index, recorded on every trial as user attr `worker`."""
    return f"{socket.gethostname()}:{os.getpid()}:{index}"


def pid_namespace() -> str:
    """This process's PID namespace (Linux), recorded as `worker_pidns`: containers that share a host name
    but not their PIDs must not judge each other's processes."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


_OWNER_ATTRS = ("worker", "worker_pidns")


def retry_callback():
    """Optuna's retry callback, except that the queued copy does not inherit the dead process's `worker`
    attrs (until the objective's first line sets its own, the retry must not look like that process's),
    and a trial skipped as a duplicate prompt is not re-run."""
    from optuna import storages

    base = getattr(storages, "RetryHeartbeatStaleTrialCallback", None) or storages.RetryFailedTrialCallback

    class Retry(base):
        def __call__(self, study, trial) -> None:
            if "duplicate_of" in trial.user_attrs:  # a skipped duplicate prompt: nothing to re-run
                return
            trial = copy.deepcopy(trial)
            trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in _OWNER_ATTRS}
            super().__call__(study, trial)

    return Retry


# --- abandoned trials -------------------------------------------------------------------------------
def _fail_trial(study, trial_id: int) -> bool:
    """FAIL a RUNNING trial and enqueue its parameters through the storage's retry callback, exactly as
    optuna.storages.fail_stale_trials does for a stale heartbeat. False if another process got there first."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    storage = study._storage  # as in fail_stale_trials: the study's (cached) view of the storage
    try:
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    _enqueue_retry(study, trial_id)
    return True


def _enqueue_retry(study, trial_id: int) -> None:
    """Queue the trial's retry through the storage's retry callback. A trial of a search (its `worker` recorded first)
    that failed before all its parameters were stored (no `prompt_key` yet: killed, or the disk full, while they were
    written) is retried from its ordinal with none of them, so the sampler draws its whole point again rather than
    completing a partial one."""
    callback = study._storage.get_heartbeat_stale_trial_callback()
    if callback is not None:
        trial = copy.deepcopy(study._storage.get_trial(trial_id))
        if "worker" in trial.user_attrs and "prompt_key" not in trial.user_attrs:  # a trial of ours, cut mid-sampling
            trial.params, trial.distributions = {}, {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            callback(study, trial)


def _process_gone(attrs: dict) -> bool:
    """True when the trial's `worker` (host:pid:index) ran on this host, in this PID namespace, and its
    process no longer exists (or is this one: we run no trial while recovering, so the pid was reused)."""
    try:
        host, pid, _ = str(attrs.get("worker")).rsplit(":", 2)
        pid = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname() or attrs.get("worker_pidns", "") != pid_namespace():
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that has exited but not been reaped yet (a killed --n-workers worker, until its parent joins it):
    os.kill(pid, 0) still finds it, /proc/PID/stat says Z (or X, being reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]  # after "pid (comm) "; comm may hold spaces and ')'
    return state in ("Z", "X")


def recover(study, grace_period: int) -> None:
    """Fail abandoned RUNNING trials and enqueue their parameters again (at most 3 retries per trial):
    - heartbeat older than the grace period (optuna.storages.fail_stale_trials): any host;
    - at once, a trial of this host whose process has exited, a zombie not reaped yet included (its `worker`
      attr names host and pid);
    - a trial without a `worker` attr started more than the grace period ago (its process died between
      Optuna creating it and the objective's first line, before any heartbeat).
    A trial of another host whose process died less than the grace period ago still looks alive; callers
    wait for it when it alone keeps the budget from being met (see `_optimize`)."""
    import optuna
    from optuna.trial import TrialState

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        started = trial.datetime_start or now
        unowned = "worker" not in trial.user_attrs
        if _process_gone(trial.user_attrs) or (unowned and (now - started).total_seconds() > grace_period):
            _fail_trial(study, trial._trial_id)
    _requeue_lost_retries(study)


def _requeue_lost_retries(study) -> None:
    """A trial FAILed with its parameters, or with the point it was queued with (`fixed_params`: the scan's prompts,
    study/trial.py `enqueue_next_scanned`), whose retry was never queued (the storage refused the enqueue: a full
    disk as it failed) is queued now, so its point still runs once, under its ordinal (the retry callback counts
    its retries)."""
    from optuna.trial import TrialState

    from promptopt.study.incumbent import is_incumbent

    trials = study.get_trials(deepcopy=False)
    # every trial that got a retry: Optuna's callback copies the failed trial's system attrs over its own, so a retry
    # of a retry keeps the first `failed_trial`; `retry_history` lists each trial retried on the way
    retried = {number for t in trials for number in t.system_attrs.get("retry_history", [])}
    for trial in trials:
        point = trial.params or trial.system_attrs.get("fixed_params")
        lost = trial.state == TrialState.FAIL and point and trial.number not in retried
        if lost and "duplicate_of" not in trial.user_attrs and not is_incumbent(trial):
            _enqueue_retry(study, trial._trial_id)


def counts(study) -> tuple[int, int, int]:
    """(finished = COMPLETE + PRUNED, RUNNING, WAITING) trials; the incumbent's trial is none of the budget's."""
    from optuna.trial import TrialState

    from promptopt.study.incumbent import is_incumbent

    states = [t.state for t in study.get_trials(deepcopy=False) if not is_incumbent(t)]
    done = sum(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states)
    return done, states.count(TrialState.RUNNING), states.count(TrialState.WAITING)


def give_back(study, trial_id: int | None) -> None:
    """The trial this process was running when it stopped (Ctrl-C, an error): FAIL it (Optuna usually has)
    and enqueue its parameters, so --resume re-runs them. Best effort: with the storage gone the trial stays
    RUNNING and the next `recover` fails it."""
    from optuna.trial import TrialState

    if trial_id is None:
        return
    try:
        state = study._storage.get_trial(trial_id).state
        if state == TrialState.RUNNING:
            _fail_trial(study, trial_id)
        elif state == TrialState.FAIL:
            _enqueue_retry(study, trial_id)
    except Exception:  # the storage is gone: recover() on resume handles the trial
        pass


# --- errors from the storage and from Optuna's logging ---------------------------------------------
def first_line(exc: BaseException, url: str | None = None) -> str:
    """The first line of an error's message, any storage URL in it (`url`, well-formed or not) masked."""
    text = redact_text(str(exc), url).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def storage_cause(exc: BaseException | None):
    """The SQLAlchemy error behind `exc`, if any (Optuna may wrap or replace it while handling it)."""
    from sqlalchemy.exc import SQLAlchemyError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SQLAlchemyError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def storage_errors(config: SearchConfig):
    """A storage that fails mid-run (server gone, network cut, disk full) becomes one StorageError line."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        cause = storage_cause(exc)
        if cause is None:
            raise
        if "disk is full" in str(cause):
            raise StorageError(
                f"cannot write the storage {redact(config.storage_url)}: database or disk is full; free some "
                "space and run again (a study that has finished trials is continued with --resume)"
            ) from None
        raise StorageError(
            f"lost the storage {redact(config.storage_url)} ({first_line(getattr(cause, 'orig', None) or cause, config.storage_url)}); "
            "a trial left RUNNING is failed and re-run by --resume"
        ) from None
