"""Run generated code in a separate, isolated, resource-limited process.

Generated code never runs in our process. Three modes (keyword `sandbox`, default `$PROMPTOPT_SANDBOX`, else
"bwrap"):

- "bwrap": bubblewrap namespaces. No nested user namespace (bwrap's --disable-userns; as root, the same limit,
  user.max_user_namespaces = 0, set in the namespace bwrap joins: see _userns_fd), no descriptor but stdin,
  stdout and stderr. No network (a new net namespace holds only an idle loopback), its own PID
  namespace (everything in it dies with it), read-only /usr, /lib* and the interpreter's stdlib only (no
  site-packages, no venv, no home: an interpreter outside /usr is bound at /opt/python; of /etc only
  ld.so.cache), tmpfs /tmp and a tmpfs work folder holding only the program, an empty environment (bwrap's
  own too: it is PID 1 inside, its environment readable there), and an unprivileged id (`SANDBOX_ID` inside; outside too when we run as
  root, else our own uid), plus the rlimits below and a process-count limit. Where bwrap is missing or cannot
  create namespaces (probed once) it falls back to "rlimit" with one warning.
- "rlimit": a temporary folder and rlimits (CPU, address space, file size, open files, no core); files and
  the network stay reachable. No process-count limit: RLIMIT_NPROC counts all of the user's processes
  (and root is exempt from it).
- "none": no isolation and no rlimits; only when asked for explicitly.

In every mode the call returns by its wall-clock time-out: output is read incrementally and capped, and when
the program ends, times out or floods its output, the whole tree is killed, including descendants that start
their own session and keep the pipes open.
"""

from __future__ import annotations

import functools
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass

from promptopt.errors import ConfigError

MODES = ("bwrap", "rlimit", "none")
MODE_ENV = "PROMPTOPT_SANDBOX"
# The uid and gid generated code runs as, inside and outside the namespaces: no account, no files and no
# other process use it (not 65534: a host process running as nobody could join the sandbox's namespace).
SANDBOX_ID = 2_000_000_000
OUTPUT_LIMIT = 1 << 20  # bytes of stdout + stderr before the program is killed
MAX_PROCESSES = 64  # tasks (processes and threads) in the sandbox; "bwrap" mode only
TMPFS_BYTES = 16 << 20  # each of /tmp, /work and /dev/shm in "bwrap" mode
GRACE_SECONDS = 0.2  # after the program exits, to drain its pipes before the rest of its tree is killed
WORK = "/work"

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
_BWRAP_WARNING = (
    "bubblewrap not available: generated code runs with rlimits only, not isolated from files or the network"
)


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
    """Execute `program`; passed means exit status 0 within the time, memory and output limits."""
    mode = sandbox_mode(sandbox)
    if mode == "bwrap" and _bwrap_plan() is None:
        mode = "rlimit"
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


def sandbox_mode(sandbox: str | None = None) -> str:
    """The requested mode: the keyword, else $PROMPTOPT_SANDBOX, else "bwrap"."""
    where = "sandbox" if sandbox is not None else MODE_ENV
    mode = sandbox if sandbox is not None else (os.environ.get(MODE_ENV) or "bwrap")
    if mode not in MODES:
        raise ConfigError(f"{where}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def bwrap_available() -> bool:
    """Whether "bwrap" mode really isolates here (bwrap present and able to create its namespaces)."""
    return _bwrap_plan() is not None


# --- running and killing -------------------------------------------------------------------------------


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


# --- modes -----------------------------------------------------------------------------------------------


def _interpreter() -> str:
    """The base interpreter, not a venv's: its stdlib is all the program may import."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    base = os.path.join(sys.base_exec_prefix, "bin", version)
    return base if os.path.exists(base) else os.path.realpath(sys.executable)


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


def _run_bwrap(program: str, *, plan: str, limit_arg: str, **budget) -> tuple[int, bytes, str]:
    """Mode "bwrap". The program travels in a memfd that bwrap copies into the sandbox's tmpfs."""
    fds = [os.memfd_create("program.py")]
    try:
        os.write(fds[0], program.encode("utf-8"))
        os.lseek(fds[0], 0, os.SEEK_SET)
        popen = {}
        if plan == "userns":
            fds.append(_userns_fd())
            popen = {"user": SANDBOX_ID, "group": SANDBOX_ID, "extra_groups": []}
            namespaces = [
                "--userns",
                str(fds[1]),
                "--unshare-pid",
                "--unshare-net",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        else:
            namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]
        ids = str(SANDBOX_ID)
        mounts, python, env = _filesystem(_interpreter())
        argv = [
            shutil.which("bwrap") or "bwrap",
            *namespaces,
            "--die-with-parent",
            "--new-session",
            "--uid",
            ids,
            "--gid",
            ids,
            *mounts,
            "--clearenv",
            *(arg for name, value in env.items() for arg in ("--setenv", name, value)),
            "--file",
            str(fds[0]),
            f"{WORK}/program.py",
            "--chdir",
            WORK,
            python,
            "-I",
            "-S",
            "-B",
            "-c",
            _LAUNCH,
            limit_arg,
            f"{WORK}/program.py",
        ]
        # bwrap's own environment is empty too: it is the sandbox's PID 1, readable in /proc/1/environ
        return _execute(argv, cwd="/", env={}, mark=False, pass_fds=fds, **popen, **budget)
    finally:
        for fd in fds:
            os.close(fd)


PYTHON_ROOT = "/opt/python"  # where an interpreter installed outside /usr (pyenv under /root) appears inside


def _filesystem(python: str) -> tuple[list[str], str, dict[str, str]]:
    """bwrap arguments for the sandbox's file system, the interpreter's path inside, and the program's
    environment. Read-only system and interpreter, empty site-packages, small tmpfs /tmp, /dev/shm and work
    folder, /proc of its own PID namespace, a minimal /dev. An interpreter outside /usr is bound at
    PYTHON_ROOT, not where it lives, so its home (e.g. /root) is not even a name inside."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    env = {"PATH": "/usr/bin:/bin", "HOME": WORK, "OPENBLAS_NUM_THREADS": "1"}
    prefixes = (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(python)))
    roots = sorted({os.path.realpath(p) for p in prefixes if not _under(os.path.realpath(p), "/usr")})
    moved = {root: PYTHON_ROOT if len(roots) == 1 else root for root in roots}  # several roots: keep their paths
    inside = lambda path: next((moved[r] + path[len(r) :] for r in roots if _under(path, r)), path)  # noqa: E731
    for root in roots:
        args += ["--ro-bind", root, moved[root]]
    for folder in _site_packages(python):
        if _under(folder, "/usr") or any(_under(folder, r) for r in roots):
            args += ["--size", "4096", "--tmpfs", inside(folder), "--remount-ro", inside(folder)]
    if any(moved[r] != r for r in roots):  # its shared libpython is found by an absolute RUNPATH
        env["LD_LIBRARY_PATH"] = ":".join(moved[r] + "/lib" for r in roots)
    args += ["--proc", "/proc", "--dev", "/dev"]
    for folder in ("/dev/shm", "/tmp", WORK):
        args += ["--size", str(TMPFS_BYTES), "--tmpfs", folder]
    return args + ["--remount-ro", "/dev", "--remount-ro", "/"], inside(os.path.realpath(python)), env


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def _site_packages(python: str) -> tuple[str, ...]:
    """The base interpreter's site-packages/dist-packages folders (third-party code such as psycopg2)."""
    probe = "import site, sys\nprint('\\n'.join(site.getsitepackages() + [p for p in sys.path if 'packages' in p]))"
    out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=30, env={}).stdout
    return tuple(sorted({os.path.realpath(p) for p in out.split() if os.path.isdir(p)}))


def _userns_fd() -> int:
    """As root: a user namespace owned by SANDBOX_ID that maps root and SANDBOX_ID onto themselves.

    bwrap joins it (--userns) running as SANDBOX_ID: root-owned files such as an interpreter under /root stay
    bindable, while generated code runs as SANDBOX_ID outside too, so RLIMIT_NPROC applies (root is exempt)."""
    helper = subprocess.Popen(
        ["unshare", "--user", "/bin/sh", "-c", "echo; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        user=SANDBOX_ID,
        group=SANDBOX_ID,
        extra_groups=[],
    )
    try:
        if not helper.stdout.readline():
            raise OSError("unshare --user failed")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{helper.pid}/{name}", "w") as handle:
                handle.write(f"0 0 1\n{SANDBOX_ID} {SANDBOX_ID} 1\n")
        _forbid_nested_userns(f"/proc/{helper.pid}/ns/user")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        helper.stdin.close()
        helper.stdout.close()
        helper.wait()


def _forbid_nested_userns(namespace: str) -> None:
    """No user namespace can be created inside `namespace` (its user.max_user_namespaces set to 0): what bwrap's
    --disable-userns does, which bwrap refuses beside --userns. Root enters the namespace (nsenter) to set it,
    as root there (uid 0 maps to itself); the sandboxed program, with no capability there, cannot raise it."""
    done = subprocess.run(
        ["nsenter", f"--user={namespace}", "/bin/sh", "-c", "echo 0 > /proc/sys/user/max_user_namespaces"],
        capture_output=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    if done.returncode != 0:
        raise OSError(f"cannot forbid nested user namespaces: {done.stderr.decode(errors='replace').strip()}")


# The probe's program: what "bwrap" mode promises, checked where it runs (user namespaces; descriptors are
# closed by _LAUNCH before any program runs).
_PROBE = (
    "try:\n"
    "    import ctypes\n"
    "except ImportError:\n"  # an interpreter built without ctypes: nothing to call unshare(2) with here
    "    raise SystemExit(0)\n"
    "if ctypes.CDLL(None).unshare(0x10000000) == 0:\n"  # CLONE_NEWUSER
    "    raise SystemExit('a nested user namespace was created')\n"
)

_plan_lock = threading.Lock()


@functools.cache
def _probe() -> str | None:
    """How bwrap works here, tried once per process with a tiny program: "userns" (as root, see _userns_fd),
    "plain" (bwrap makes its own user namespace), or None (warned once; "bwrap" mode falls back to "rlimit")."""
    if shutil.which("bwrap") is None:
        warnings.warn(f"{_BWRAP_WARNING} (no bwrap on PATH; apt-get install bubblewrap)", RuntimeWarning, stacklevel=4)
        return None
    plans = (["userns"] if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("nsenter") else []) + [
        "plain"
    ]
    errors = []
    for plan in plans:
        code, err, reason = _try_plan(plan)
        if code == 0 and not reason:
            if plan == "plain" and os.geteuid() == 0:
                warnings.warn(
                    "bubblewrap runs as root without a user namespace of its own (util-linux `unshare` and "
                    "`nsenter`): generated code is isolated but its process count is not limited",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return plan
        errors.append(f"{plan}: {reason or _failure(err, code)}")
    warnings.warn(f"{_BWRAP_WARNING} ({'; '.join(errors)})", RuntimeWarning, stacklevel=4)
    return None


def _try_plan(plan: str) -> tuple[int, bytes, str]:
    """Run the probe's program under `plan`: (exit status, stderr, reason) as `_execute` returns them."""
    try:
        return _run_bwrap(_PROBE, plan=plan, limit_arg="NPROC=16", timeout=30.0, output_limit=OUTPUT_LIMIT)
    except OSError as exc:
        return -1, str(exc).encode(), ""


def _bwrap_plan() -> str | None:
    with _plan_lock:
        return _probe()
