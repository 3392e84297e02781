"""Running a sandboxed program's process tree: by a wall-clock deadline, with its output read as it comes and
capped, and every process of the tree killed at the end, including descendants that start their own session
and keep the pipes open. Used by every mode of promptopt/tasks/sandbox.py."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid

OUTPUT_LIMIT = 1 << 20  # bytes of stdout + stderr before the program is killed
GRACE_SECONDS = 0.2  # after the program exits, to drain its pipes before the rest of its tree is killed

# Runs first inside the sandbox: closes every descriptor but 0, 1, 2 (bwrap passes on those it was given, the
# user namespace it joined among them), sets the rlimits, then replaces itself with the program.
_LAUNCH = (
    "import os, resource, sys\n"
    "os.closerange(3, max(os.sysconf('SC_OPEN_MAX'), 1 << 16))\n"
    "for item in filter(None, sys.argv[1].split(',')):\n"
    "    name, value = item.split('=')\n"
    "    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (int(value), int(value)))\n"
    "os.execv(sys.executable, [sys.executable, '-I', '-B', sys.argv[2]])\n"
)
_TOKEN_ENV = "PROMPTOPT_SANDBOX_RUN"


def _execute(
    argv: list[str], *, timeout: float, output_limit: int, mark: bool = True, **popen
) -> tuple[int, bytes, str]:
    """Run argv in its own session; return (exit status, stderr, "" | "timeout" | "output_limit").

    Never blocks past the deadline: pipes are read as data comes, the program's exit is watched without
    reaping it (so its process group id stays ours to kill), and at the end its whole tree is killed.
    `mark`: carry a token in the environment to find descendants that left the group (not for bwrap: its
    PID namespace dies with it, and its environment stays empty)."""
    token = uuid.uuid4().hex
    if mark:
        popen["env"] = {**popen.get("env", {}), _TOKEN_ENV: token}
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **popen,
    )
    pipes = {proc.stdout.fileno(): proc.stdout, proc.stderr.fileno(): proc.stderr}
    inodes = {os.fstat(fd).st_ino for fd in pipes}
    err, total, reason, exited_at = bytearray(), 0, "", None
    try:
        with selectors.DefaultSelector() as selector:
            for pipe in pipes.values():
                selector.register(pipe, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if exited_at is None and _exited(proc.pid):
                    exited_at = now
                if exited_at is not None and (not selector.get_map() or now > exited_at + GRACE_SECONDS):
                    break
                if now >= start + timeout:
                    reason = "timeout"
                    break
                for key, _ in selector.select(min(0.05, start + timeout - now)):
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    total += len(chunk)
                    if key.fileobj is proc.stderr:
                        err += chunk
                if total > output_limit:
                    reason = "output_limit"
                    break
    finally:
        _kill_tree(proc.pid, inodes, token)
        for pipe in pipes.values():
            pipe.close()
        proc.wait()
    return proc.returncode, bytes(err), reason


def _exited(pid: int) -> bool:
    """Whether the child has ended, leaving it unreaped (its pid, and so its group id, cannot be reused)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped by someone else (a SIGCHLD handler)
        return True


def _kill_tree(pid: int, inodes: set[int], token: str) -> None:
    """SIGKILL the child's process group, then, a few rounds until none is left, every process that still
    holds the write end of one of our pipes or carries the run's token in its environment (descendants that
    left the group). In "bwrap" mode, killing bwrap ends its PID namespace and so everything in it."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    needle = f"{_TOKEN_ENV}={token}".encode()
    for _ in range(10):
        stragglers = [p for p in _pids() if _holds_pipe(p, inodes) or needle in _read(f"/proc/{p}/environ")]
        if not stragglers:
            return
        for straggler in stragglers:
            try:
                os.kill(straggler, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _pids() -> list[int]:
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]


def _holds_pipe(pid: int, inodes: set[int]) -> bool:
    """Whether `pid` can write into one of the pipes (a read end is ours, or inherited by a fork of ours)."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("pipe:[") and int(link[6:-1]) in inodes:
                flags = _read(f"/proc/{pid}/fdinfo/{fd}").split(b"flags:")[1].split()[0]
                if int(flags, 8) & os.O_ACCMODE == os.O_WRONLY:
                    return True
    except (OSError, IndexError, ValueError):
        pass
    return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _failure(err: bytes, code: int) -> str:
    """The exception line, with the program line that raised it: 'AssertionError (line 3: assert f() == 2)'."""
    lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return f"exit status {code}"
    last = lines[-1].strip()
    for i in range(len(lines) - 2, -1, -1):
        match = re.match(r'\s*File ".*program\.py", line (\d+)', lines[i])
        if match:
            source = lines[i + 1].strip()
            return f"{last} (line {match[1]}: {source})" if not source.startswith(("File ", "^", "~")) else last
    return last


def _interpreter() -> str:
    """The base interpreter, not a venv's: its stdlib is all the program may import."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    base = os.path.join(sys.base_exec_prefix, "bin", version)
    return base if os.path.exists(base) else os.path.realpath(sys.executable)
