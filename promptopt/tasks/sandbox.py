"""Run generated code in a separate, resource-limited process.

The child runs `python -I` (isolated: no user site, no PYTHON* env vars) in an empty temporary folder with
an empty environment, its own session (the whole group is killed on time-out), and rlimits on CPU time,
address space, file size, open files and core dumps. Generated code never runs in our process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # "passed" | "failed" | "timeout" | "error"
    detail: str = ""


def _limits(cpu_seconds: int, memory_bytes: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_python(program: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> SandboxResult:
    """Execute `program`; passed means exit status 0 within the time and memory limits."""
    with tempfile.TemporaryDirectory(prefix="promptopt-sandbox-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", path],
                cwd=folder,
                env={"PATH": "/usr/bin:/bin", "HOME": folder, "OPENBLAS_NUM_THREADS": "1"},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=_limits(int(timeout) + 1, memory_mb << 20),
            )
        except OSError as exc:
            return SandboxResult(False, "error", str(exc))
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return SandboxResult(False, "timeout", f"killed after {timeout:g}s")
        if proc.returncode == 0:
            return SandboxResult(True, "passed")
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
        return SandboxResult(False, "failed", tail[0] if tail else f"exit status {proc.returncode}")
