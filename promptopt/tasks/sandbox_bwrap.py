"""The "bwrap" mode of promptopt/tasks/sandbox.py: the bubblewrap command line (namespaces, the read-only file
system, the empty environment), as root the user namespace it joins (owned by SANDBOX_ID, nested user
namespaces forbidden), and the probe that finds, once per process, how bwrap works here."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
import warnings

from promptopt.tasks.sandbox_process import _LAUNCH, OUTPUT_LIMIT, _execute, _failure, _interpreter

# The uid and gid generated code runs as, inside and outside the namespaces: no account, no files and no
# other process use it (not 65534: a host process running as nobody could join the sandbox's namespace).
SANDBOX_ID = 2_000_000_000
TMPFS_BYTES = 16 << 20  # each of /tmp, /work and /dev/shm in "bwrap" mode
WORK = "/work"


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
_unavailable = ""  # why the last probe found no way to run bwrap


def unavailable_reason() -> str:
    """Why "bwrap" mode cannot run here (after a probe that returned None), in words."""
    return _unavailable


@functools.cache
def _probe() -> str | None:
    """How bwrap works here, tried once per process with a tiny program: "userns" (as root, see _userns_fd),
    "plain" (bwrap makes its own user namespace), or None, with the reason in `unavailable_reason()` ("bwrap" mode
    then refuses to run anything: it never falls back to a weaker mode by itself)."""
    global _unavailable
    if shutil.which("bwrap") is None:
        _unavailable = "no bwrap on PATH"
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
    _unavailable = f"bwrap cannot create its namespaces here: {'; '.join(errors)}"
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
