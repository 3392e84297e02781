"""CLI processes forked from a warm server: real processes (own pid, killable with SIGKILL, Ctrl-C as
SIGINT, exit status, files and SQLite connections of their own) without paying an interpreter start and
the torch / transformers / optuna imports each time (~8 s of every short CLI process on 2 cores).

It is `multiprocessing`'s forkserver: one server per test process imports the heavy modules once (imports
only: no thread pool is started before a fork), then forks a child per command. The child takes the
environment, working directory and signal handlers a fresh `python -m promptopt` would have, writes
stdout/stderr to files the test reads as they grow, and runs `promptopt.cli.main`. What only a fresh
interpreter shows (a hash seed, what an import pulls in) stays with `subprocess`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.auto.tokenization_auto",
    "tokenizers",
    "optuna",
    "sqlalchemy",
    "pandas",
    "pyarrow.parquet",
    "promptopt.cli",
    "promptopt.workflows",
    "promptopt.study",
    "promptopt.robustness",
    "promptopt.scoring",
]
_context = None


def _fork_context():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(argv: list[str], env: dict, cwd: str, out_path: str, err_path: str) -> None:
    """In the forked process: become `promptopt ARGV` and exit with its status."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt, as in a terminal
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, out_path), (2, err_path)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or 1))
    sys.argv = ["promptopt", *argv]
    code = 1
    try:
        from promptopt.cli import main

        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a bug: its traceback, as an interpreter would print it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedProcess:
    """What tests use of a Popen: pid, poll, wait, returncode, send_signal; output in two growing files."""

    def __init__(self, argv: list[str], *, env: dict, cwd: str | Path) -> None:
        self._dir = tempfile.mkdtemp(prefix="promptopt-forked-")
        self.out_path, self.err_path = os.path.join(self._dir, "stdout"), os.path.join(self._dir, "stderr")
        Path(self.out_path).touch()
        Path(self.err_path).touch()
        self._proc = _fork_context().Process(
            target=_child, args=(list(argv), dict(env), str(cwd), self.out_path, self.err_path), daemon=False
        )
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise TimeoutError(f"forked promptopt {self.pid} still running after {timeout}s")
        return self._proc.exitcode

    def read(self) -> tuple[str, str]:
        return (Path(self.out_path).read_text(errors="replace"), Path(self.err_path).read_text(errors="replace"))


def wait_until(predicate, timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return predicate()
