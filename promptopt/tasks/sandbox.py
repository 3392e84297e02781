"""Run generated code in a separate, isolated, resource-limited process.

Generated code never runs in our process, and by default only under bubblewrap. Three modes:

- "bwrap" (the default, and the only one a task file can name): bubblewrap namespaces. No nested user namespace
  (bwrap's --disable-userns; as root, the same limit,
  user.max_user_namespaces = 0, set in the namespace bwrap joins: see sandbox_bwrap._userns_fd), no descriptor but stdin,
  stdout and stderr. No network (a new net namespace holds only an idle loopback), its own PID
  namespace (everything in it dies with it), read-only /usr, /lib* and the interpreter's stdlib only (no
  site-packages, no venv, no home: an interpreter outside /usr is bound at /opt/python; of /etc only
  ld.so.cache), tmpfs /tmp and a tmpfs work folder holding only the program, an empty environment (bwrap's
  own too: it is PID 1 inside, its environment readable there), and an unprivileged id (`SANDBOX_ID` inside; outside too when we run as
  root, else our own uid), plus the rlimits below and a process-count limit. Where bwrap is missing or cannot
  create namespaces (probed once) nothing runs: `SandboxUnavailable`, one line naming the cause, the package and
  the flag below. It never falls back to a weaker mode by itself.
- "rlimit": a temporary folder and rlimits (CPU, address space, file size, open files, no core); files and
  the network stay reachable. No process-count limit: RLIMIT_NPROC counts all of the user's processes
  (and root is exempt from it). Only when the user asks for it: the CLI's `promptopt --unsafe-sandbox rlimit ...`
  (`allow_unsafe`, which warns on every run), or the `sandbox=` keyword of a direct `run_python` call.
- "none": no isolation and no rlimits; only through the `sandbox=` keyword of a direct `run_python` call.

No task file and no environment variable chooses the mode: what a task's code answers run under is decided by
the person running promptopt, on the command line.

In every mode the call returns by its wall-clock time-out: output is read incrementally and capped, and when
the program ends, times out or floods its output, the whole tree is killed, including descendants that start
their own session and keep the pipes open.

Modules: this one (the modes and the call), sandbox_process.py (running and killing a program's process tree),
sandbox_bwrap.py (bubblewrap's command line, root's user namespace, the probe).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from promptopt.errors import ConfigError, UnsupportedError
from promptopt.tasks import sandbox_bwrap
from promptopt.tasks.sandbox_bwrap import SANDBOX_ID, TMPFS_BYTES, WORK, _bwrap_plan, _run_bwrap
from promptopt.tasks.sandbox_process import _LAUNCH, OUTPUT_LIMIT, _execute, _failure, _interpreter

_probe, _try_plan = sandbox_bwrap._probe, sandbox_bwrap._try_plan  # here too: tests reset and try the plans
MODES = ("bwrap", "rlimit", "none")
UNSAFE_FLAG = "--unsafe-sandbox"
UNSAFE_MODES = ("rlimit",)  # what the flag may choose ("none" is for direct run_python calls only)
UNSAFE_WARNING = (
    "warning: {flag} {mode}: code answers run with rlimits only, NOT isolated from this machine's files, "
    "network or processes (install bubblewrap and drop the flag to isolate them)"
)
MAX_PROCESSES = 64  # tasks (processes and threads) in the sandbox; "bwrap" mode only


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # "passed" | "failed" | "timeout" | "output_limit" | "error"
    detail: str = ""
    mode: str = ""  # the isolation the program ran under: "bwrap" | "rlimit" | "none"


def run_python(
    program: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    sandbox: str | None = None,
    output_limit: int = OUTPUT_LIMIT,
    max_processes: int = MAX_PROCESSES,
) -> SandboxResult:
    """Execute `program`; passed means exit status 0 within the time, memory and output limits. `sandbox`: the mode
    (default: "bwrap", or what `allow_unsafe` set); "bwrap" where bubblewrap cannot run raises SandboxUnavailable."""
    mode = sandbox_mode(sandbox)
    if mode == "bwrap" and _bwrap_plan() is None:
        raise SandboxUnavailable(
            f"code answers run only under bubblewrap, which cannot run here ({sandbox_bwrap.unavailable_reason()}): "
            f"apt-get install bubblewrap, or accept running them without isolation with "
            f"`promptopt {UNSAFE_FLAG} rlimit COMMAND ...`"
        )
    limits = {"CPU": int(timeout) + 1, "AS": memory_mb << 20, "FSIZE": 16 << 20, "NOFILE": 64, "CORE": 0}
    if mode == "bwrap":
        limits["NPROC"] = max_processes
    limit_arg = ",".join(f"{k}={v}" for k, v in limits.items()) if mode != "none" else ""
    budget = {"timeout": timeout, "output_limit": output_limit}
    try:
        if mode == "bwrap":
            code, err, reason = _run_bwrap(program, plan=_bwrap_plan(), limit_arg=limit_arg, **budget)
        else:
            code, err, reason = _run_local(program, limit_arg=limit_arg, **budget)
    except OSError as exc:
        return SandboxResult(False, "error", str(exc), mode)
    if reason == "timeout":
        return SandboxResult(False, "timeout", f"killed after {timeout:g}s", mode)
    if reason == "output_limit":
        return SandboxResult(False, "output_limit", f"killed after more than {output_limit} bytes of output", mode)
    if code == 0:
        return SandboxResult(True, "passed", "", mode)
    detail = _failure(err, code)
    return SandboxResult(False, "error" if detail.startswith("bwrap: ") else "failed", detail, mode)


class SandboxUnavailable(UnsupportedError):
    """The sandbox a code answer needs cannot run here (no bubblewrap), and no weaker mode was asked for."""


_unsafe: str | None = None  # the weaker mode the user asked for on the command line (allow_unsafe), if any


def allow_unsafe(mode: str | None) -> str | None:
    """Let code answers run in a weaker `mode` ("rlimit") in this process, or back to "bwrap" only (None): what the
    CLI's --unsafe-sandbox does, saying so (UNSAFE_WARNING) on every run. -> the warning line, or None."""
    global _unsafe
    if mode is not None and mode not in UNSAFE_MODES:
        raise ConfigError(f"{UNSAFE_FLAG}: expected {' or '.join(UNSAFE_MODES)}, got {mode!r}")
    _unsafe = mode
    return UNSAFE_WARNING.format(flag=UNSAFE_FLAG, mode=mode) if mode else None


def unsafe_mode() -> str | None:
    """The weaker mode allowed in this process (for worker processes to allow it too), or None."""
    return _unsafe


def sandbox_mode(sandbox: str | None = None) -> str:
    """The mode a call runs in: the keyword, else the one `allow_unsafe` set, else "bwrap"."""
    mode = sandbox if sandbox is not None else (_unsafe or "bwrap")
    if mode not in MODES:
        raise ConfigError(f"sandbox: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def bwrap_available() -> bool:
    """Whether "bwrap" mode really isolates here (bwrap present and able to create its namespaces)."""
    return _bwrap_plan() is not None


def _run_local(program: str, *, limit_arg: str, **budget) -> tuple[int, bytes, str]:
    """Modes "rlimit" and "none": a temporary folder on this machine."""
    with tempfile.TemporaryDirectory(prefix="promptopt-sandbox-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        python = _interpreter()
        return _execute(
            [python, "-I", "-S", "-B", "-c", _LAUNCH, limit_arg, path],
            cwd=folder,
            env={"PATH": "/usr/bin:/bin", "HOME": folder, "OPENBLAS_NUM_THREADS": "1"},
            **budget,
        )


__all__ = [
    "MAX_PROCESSES",
    "MODES",
    "OUTPUT_LIMIT",
    "SANDBOX_ID",
    "TMPFS_BYTES",
    "UNSAFE_FLAG",
    "UNSAFE_MODES",
    "WORK",
    "SandboxResult",
    "SandboxUnavailable",
    "allow_unsafe",
    "bwrap_available",
    "run_python",
    "sandbox_mode",
    "unsafe_mode",
]
