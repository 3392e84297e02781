"""Worker processes: workers 1..n-1 of a run are spawned processes that each load the model and join the
study (worker 0 is the run's own process); other machines join the same study with --resume."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from contextlib import contextmanager

from promptopt.errors import UserError
from promptopt.study.config import SearchConfig
from promptopt.study.context import build_context, fit_space_to_model
from promptopt.study.recovery import as_worker, storage_errors, worker_name
from promptopt.study.storage import make_storage, open_study, quiet_optuna
from promptopt.study.trial import optimize


def worker_main(
    config_dict: dict, factory, index: int, ready=None, errors=None, expand=None, unsafe_sandbox=None
) -> None:
    """Entry point of a worker process: builds its own scorer from the factory (model, task data, the
    shared result cache), signals `ready`, and joins the study. A user error goes to `errors` (the parent
    reports it in one line); Ctrl-C exits quietly with status 130. `unsafe_sandbox`: the weaker code sandbox the
    parent's user asked for (--unsafe-sandbox; the parent warned), which a spawned process does not inherit."""
    import transformers

    from promptopt.tasks.sandbox import allow_unsafe

    allow_unsafe(unsafe_sandbox)
    as_worker(index)
    quiet_optuna()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # the parent shows the progress
    config = SearchConfig.from_dict(config_dict)
    try:
        with storage_errors(config):
            cached = factory()
            ctx = build_context(config, cached.data, expand)
            fit_space_to_model(ctx, cached.lm.tokenizer)  # as the parent did: the same templates are searched
            storage = make_storage(config)
            study = open_study(config, ctx.strategy, storage, index=index, create=False, n_items=len(ctx.dev))
            if ready is not None:
                ready.set()
            budget = config.study.budget_minutes  # this worker's share of --budget, from when it joined
            spent = float(study.user_attrs.get("search_seconds", 0.0))
            deadline = None if budget is None else time.monotonic() + 60 * budget - spent
            optimize(ctx, study, cached, None, worker_name(index), deadline=deadline)
    except KeyboardInterrupt:
        sys.exit(130)
    except UserError as exc:
        if errors is not None:
            errors.put(f"worker {index}: {exc}")
        sys.exit(2)


@contextmanager
def workers(config: SearchConfig, factory, expand=None):
    """Workers 1..n-1 as spawned processes, started together (each with its model loaded). On the way out
    they are joined; if this process stops early (Ctrl-C, an error) they are interrupted so each gives its
    trial back, then terminated if they do not stop."""
    n = config.study.n_workers
    from promptopt.tasks.sandbox import unsafe_mode

    spawn = multiprocessing.get_context("spawn")
    errors = spawn.Queue() if n > 1 else None
    ready = [spawn.Event() for _ in range(1, n)]
    procs = [
        spawn.Process(
            target=worker_main, args=(config.to_dict(), factory, i, ready[i - 1], errors, expand, unsafe_mode())
        )
        for i in range(1, n)
    ]
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
    failed = [proc.exitcode for proc in procs if proc.exitcode and proc.exitcode > 0]
    for index, proc in enumerate(procs, 1):
        if proc.exitcode is not None and proc.exitcode < 0:  # killed by a signal: its trial was failed and re-run
            name = signal.Signals(-proc.exitcode).name if -proc.exitcode in signal.valid_signals() else -proc.exitcode
            print(f"note: worker {index} (pid {proc.pid}) was killed by {name}; its trial was re-run", file=sys.stderr)
    if failed:
        message = errors.get(timeout=1) if errors is not None and not errors.empty() else None
        raise UserError(
            message or f"{len(failed)} worker process(es) failed (exit codes {failed}); see their output above"
        )


def _interrupt(procs, grace: float = 5.0) -> None:
    """Stop workers early: a terminal's Ctrl-C reached them already, so give them a moment; then SIGINT (each
    fails and re-queues its trial), then SIGTERM for any that still does not stop."""
    for sig in (None, signal.SIGINT, signal.SIGTERM):
        alive = [proc for proc in procs if proc.is_alive()]
        for proc in alive if sig is not None else ():
            os.kill(proc.pid, sig)
        deadline = time.monotonic() + grace
        for proc in alive:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
