"""The code sandbox contains hostile programs: no secrets, no writes outside, no network, no venv packages,
no fork storm, no survivors, no output flood, no memory or CPU bomb; and every call returns by its time-out.

bwrap-specific tests skip where bubblewrap is unavailable, except in CI ($CI set), which installs it."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from promptopt.errors import ConfigError
from promptopt.tasks import sandbox
from promptopt.tasks.sandbox import SANDBOX_ID, bwrap_available, run_python

MARGIN = 2.0  # seconds a call may take beyond its time-out


@pytest.fixture
def bwrap():
    if not bwrap_available():
        if os.environ.get("CI"):
            pytest.fail("CI must provide bubblewrap: .ci/run installs it (apt-get install bubblewrap)")
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create namespaces here (apt-get install bubblewrap)")


requires_bwrap = pytest.mark.usefixtures("bwrap")


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    monkeypatch.setattr(sandbox, "_unsafe", None, raising=False)  # no --unsafe-sandbox from an earlier test


def working_mode() -> str:
    """The strongest mode that runs here: "bwrap", else "rlimit" (asked for explicitly)."""
    return "bwrap" if bwrap_available() else "rlimit"


def timed(program: str, **kwargs):
    start = time.monotonic()
    result = run_python(program, **kwargs)
    return result, time.monotonic() - start


def contained(attempt: str, errors: str = "OSError") -> str:
    """A program that exits 0 only when `attempt` raises one of `errors`."""
    body = "\n".join("    " + line for line in attempt.strip().splitlines())
    return f"import os, sys\ntry:\n{body}\nexcept ({errors},):\n    sys.exit(0)\nsys.exit('LEAKED')\n"


def isolated(program: str, **kwargs):
    result, seconds = timed(program, **kwargs)
    assert result.mode == "bwrap"
    assert seconds < kwargs.get("timeout", 10.0) + MARGIN
    return result, seconds


def alive(marker: str) -> list[int]:
    """Processes whose command line carries `marker` (scanned in /proc, no psutil)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(name))
    return found


def host_uid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def sleeper(marker: str, seconds: int) -> str:
    """Program text that replaces the current process by a sleeper whose command line carries `marker`."""
    return f"os.execv(sys.executable, [sys.executable, '-S', '-c', 'import time; time.sleep({seconds})', {marker!r}])"


class Watch:
    """Counts the marked processes (and their host uids) while a sandboxed call runs."""

    def __init__(self, marker: str) -> None:
        self.marker, self.most, self.uids, self._stop = marker, 0, set(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = alive(self.marker)
            self.most = max(self.most, len(pids))
            self.uids |= {uid for uid in map(host_uid, pids) if uid is not None}
            time.sleep(0.05)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_passing_and_failing_programs():
    assert run_python("assert sum(range(4)) == 6", sandbox=working_mode()).passed
    failed = run_python("def f():\n    return 1\n\nassert f() == 2, 'f is off'\n", sandbox=working_mode())
    assert failed.status == "failed" and not failed.passed
    assert "AssertionError: f is off" in failed.detail and "line 4: assert f() == 2" in failed.detail


@requires_bwrap
@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow"])
def test_system_secrets_unreadable(path):
    result, _ = isolated(contained(f"open({path!r}).read()"))
    assert result.passed, result.detail


@requires_bwrap
def test_home_unreadable():
    home = Path.home()
    try:
        handle = tempfile.NamedTemporaryFile("w", dir=home, prefix=".promptopt-secret-", suffix=".txt")
    except OSError:
        pytest.skip(f"cannot plant a file in {home}")
    with handle:
        handle.write("hunter2")
        handle.flush()
        result, _ = isolated(contained(f"open({handle.name!r}).read()"))
        assert result.passed, result.detail
        name = Path(handle.name).name
        listing = (
            f"import os\ntry:\n    names = os.listdir({str(home)!r})\nexcept OSError:\n    names = []\n"
            f"assert {name!r} not in names"
        )
        result, _ = isolated(listing)
        assert result.passed, result.detail


@requires_bwrap
def test_parent_environment_invisible(monkeypatch):
    monkeypatch.setenv("PROMPTOPT_PLANTED_SECRET", "hunter2-" + uuid.uuid4().hex)
    secret = os.environ["PROMPTOPT_PLANTED_SECRET"]
    program = (
        "import os\n"
        f"assert {secret!r} not in repr(dict(os.environ))\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        f"    assert {secret.encode()!r} not in data, pid\n"
    )
    result, _ = isolated(program)
    assert result.passed, result.detail


@requires_bwrap
def test_no_host_variable_in_any_process_and_no_home(monkeypatch):
    """/proc/1/environ inside is bwrap's own environment (its PID 1): it was the host's PATH (/root/.cargo,
    /root/.pyenv...). Now no process inside holds a host variable, the program sees only the sandbox's
    own, and the interpreter's home (/root here) is not a name inside."""
    monkeypatch.setenv("PROMPTOPT_PLANTED", "planted-" + uuid.uuid4().hex)
    host = {f"{k}={v}".encode() for k, v in os.environ.items()}
    program = (
        f"import os, sys\nHOME = {os.path.expanduser('~')!r}\n"
        "found = {}\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        found[pid] = [e for e in open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0') if e]\n"
        "    except OSError:\n"
        "        pass\n"
        "sys.exit(repr((found, sorted(os.listdir('/')), os.path.exists(HOME))))\n"
    )
    result, _ = isolated(program)
    environs, top, home_exists = ast.literal_eval(result.detail)  # our own program's repr
    assert environs["1"] == [], environs["1"]  # bwrap itself
    for pid, entries in environs.items():
        assert not host & set(entries), (pid, host & set(entries))
        assert {e.split(b"=")[0] for e in entries} <= {
            b"PATH",
            b"HOME",
            b"OPENBLAS_NUM_THREADS",
            b"LD_LIBRARY_PATH",
            b"PWD",
            b"LC_CTYPE",
        }, (pid, entries)
    assert "root" not in top and "home" not in top and not home_exists, top
    assert sorted(top) == sorted(
        set(top) & {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "opt", "proc", "sbin", "tmp", "usr", "work"}
    ), top


@requires_bwrap
def test_writes_outside_do_not_land(tmp_path):
    target = tmp_path / "written-by-sandbox.txt"
    result, _ = isolated(contained(f"open({str(target)!r}, 'w').write('x')"))
    assert result.passed, result.detail
    assert not target.exists()
    result, _ = isolated(contained("open('/usr/promptopt-sandbox-probe', 'w').write('x')"))
    assert result.passed, result.detail


@requires_bwrap
def test_no_network_to_local_ports():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        attempt = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
        result, _ = isolated(contained(attempt))
        assert result.passed, result.detail
        with pytest.raises(BlockingIOError):
            server.accept()
    postgres, _ = isolated(contained("import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=2)"))
    assert postgres.passed, postgres.detail


@requires_bwrap
@pytest.mark.parametrize("module", ["psycopg2", "yaml"])
def test_venv_packages_not_importable(module):
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        pytest.skip(f"{module} is not installed in this environment")
    site = str(Path(spec.origin).parents[1])  # the site-packages folder holding the package
    attempt = f"import sys\nsys.path.insert(0, {site!r})\nimport {module}"
    result, _ = isolated(contained(attempt, errors="ImportError"))
    assert result.passed, result.detail
    listing, _ = isolated(f"import os\nassert not os.path.isdir({site!r}) or not os.listdir({site!r})")
    assert listing.passed, listing.detail  # absent (a venv), or masked by an empty tmpfs (the base interpreter's)


@requires_bwrap
def test_runs_as_unprivileged_id():
    result, _ = isolated(f"import os\nassert os.getuid() == os.getgid() == {SANDBOX_ID}, (os.getuid(), os.getgid())")
    assert result.passed, result.detail


@requires_bwrap
def test_fork_storm_contained():
    marker = f"promptopt-storm-{uuid.uuid4().hex}"
    program = (
        "import os, sys, time\n"
        "forked = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        f"        {sleeper(marker, 60)}\n"
        "    forked += 1\n"
        "print(forked, file=sys.stderr, flush=True)\n"
        "time.sleep(60)\n"
    )
    with Watch(marker) as watch:
        result, seconds = isolated(program, timeout=3)
    assert result.status == "timeout"
    assert 0 < watch.most < 200, watch.most  # the storm happened, capped by the process limit
    assert 0 not in watch.uids  # not root on the host either
    time.sleep(0.2)
    assert alive(marker) == []


@requires_bwrap
def test_setsid_survivor_does_not_hold_the_call():
    reproduce = "import os,time\nif os.fork()==0:\n    os.setsid(); time.sleep(15)\n"
    _, seconds = isolated(reproduce, timeout=3)
    marker = f"promptopt-survivor-{uuid.uuid4().hex}"
    program = f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    {sleeper(marker, 15)}\n"
    result, _ = isolated(program, timeout=3)
    assert result.passed, result.detail
    time.sleep(0.2)
    assert alive(marker) == []


@pytest.fixture(params=["userns", "plain"])
def plan(request, monkeypatch, bwrap) -> str:
    """Each way bwrap runs here (as root: joining a user namespace made for SANDBOX_ID, "userns"; bwrap making
    its own, "plain"), forced for the test; skipped, saying why, where that way cannot run."""
    code, err, reason = sandbox._try_plan(request.param)
    if code != 0 or reason:
        pytest.skip(f"bwrap plan {request.param!r} cannot run here: {reason or sandbox._failure(err, code)}")
    monkeypatch.setattr(sandbox, "_bwrap_plan", lambda: request.param)
    return request.param


DESCRIPTORS = """
import os, re, sys
def links(pid):
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    return found
mine = links("self")
namespaces = {pid: [link for link in links(pid).values() if re.match(r"[a-z_]+:\\[\\d+\\]$", link)
              and not link.startswith(("pipe:", "socket:"))]
              for pid in os.listdir("/proc") if pid.isdigit()}
if sorted(mine) != [0, 1, 2] or any(namespaces.values()):
    sys.exit(f"descriptors {mine}, namespace descriptors {namespaces}")
"""


@requires_bwrap
def test_the_program_inherits_no_descriptor_but_its_pipes(plan):
    """bwrap hands the program every descriptor it was given (the user namespace it joined, as root, used to
    be descriptor 4 of the program): the program sees 0, 1 and 2 only, and no process in the sandbox holds a
    namespace descriptor."""
    result, _ = isolated(DESCRIPTORS)
    assert result.passed, result.detail


NESTED_USERNS = """
import ctypes, os, shutil, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    sys.exit("unshare(CLONE_NEWUSER) created a user namespace")
errno = ctypes.get_errno()
if shutil.which("unshare"):
    done = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
    if done.returncode == 0:
        sys.exit("unshare -U created a user namespace")
    print(done.stderr.strip(), file=sys.stderr)
print(os.strerror(errno), file=sys.stderr)
"""


@requires_bwrap
def test_the_program_cannot_create_a_user_namespace(plan):
    """Nested user namespaces are refused inside (bwrap's --disable-userns, or the same limit set in the
    namespace the "userns" plan joins), both by the unshare(2) system call and by `unshare -U`; the same
    program outside the sandbox, where this machine allows user namespaces, creates one: the check can fail."""
    result, _ = isolated(NESTED_USERNS)
    assert result.passed, result.detail
    outside = subprocess.run(["unshare", "-U", "true"], capture_output=True) if shutil.which("unshare") else None
    if outside is not None and outside.returncode == 0:
        leaked = run_python(NESTED_USERNS, sandbox="none")
        assert not leaked.passed and "created a user namespace" in leaked.detail, leaked


def rss_growth(program: str, **kwargs) -> tuple[object, int]:
    """(result, bytes by which this process's peak RSS rose above its RSS before the call)."""

    def status(field: str) -> int:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field))
        return int(line.split()[1]) << 10

    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = status("VmRSS:")
    result = run_python(program, **kwargs)
    return result, status("VmHWM:") - before


HUGE_OUTPUT = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.write(chunk)\n"


@requires_bwrap
def test_huge_output_is_capped():
    result, growth = rss_growth(HUGE_OUTPUT, timeout=10)
    assert result.status == "output_limit" and result.mode == "bwrap"
    assert growth < 32 << 20, growth


@requires_bwrap
def test_memory_bomb_contained():
    result, _ = isolated("x = bytearray(4 << 30)\nx[-1] = 1\n", timeout=10)
    assert result.status == "failed" and "MemoryError" in result.detail


@requires_bwrap
def test_cpu_bomb_times_out():
    result, seconds = isolated("while True:\n    pass\n", timeout=2)
    assert result.status == "timeout" and seconds >= 2


# --- the fallback and the explicit modes -----------------------------------------------------------------


def test_rlimit_mode_kills_setsid_survivor():
    marker = f"promptopt-survivor-{uuid.uuid4().hex}"
    program = f"import os, sys\nif os.fork() == 0:\n    os.setsid()\n    {sleeper(marker, 15)}\n"
    result, seconds = timed(program, timeout=3, sandbox="rlimit")
    assert result.mode == "rlimit" and result.passed and seconds < 3 + MARGIN
    time.sleep(0.2)
    assert alive(marker) == []
    hung = program + "import time\ntime.sleep(15)\n"  # the program hangs too: killed at its time-out
    result, seconds = timed(hung, timeout=2, sandbox="rlimit")
    assert result.status == "timeout" and seconds < 2 + MARGIN
    time.sleep(0.2)
    assert alive(marker) == []


def test_rlimit_mode_caps_output():
    result, growth = rss_growth(HUGE_OUTPUT, timeout=10, sandbox="rlimit")
    assert result.status == "output_limit" and growth < 32 << 20, growth


def test_mode_none_only_when_asked(monkeypatch):
    reads = "open('/etc/passwd').read()"
    assert run_python(reads, sandbox="none").mode == "none"
    monkeypatch.setenv("PROMPTOPT_SANDBOX", "none")  # no environment variable chooses a mode (it once did)
    if bwrap_available():
        assert run_python(reads).mode == "bwrap"
    else:
        with pytest.raises(sandbox.SandboxUnavailable):
            run_python(reads)
    assert sandbox.allow_unsafe("rlimit").startswith("warning: --unsafe-sandbox rlimit: ")
    assert run_python(reads).mode == "rlimit"
    assert sandbox.allow_unsafe(None) is None and sandbox.sandbox_mode() == "bwrap"
    with pytest.raises(ConfigError, match="--unsafe-sandbox: expected rlimit, got 'none'"):
        sandbox.allow_unsafe("none")  # the flag never turns isolation and limits off altogether
    with pytest.raises(ConfigError, match="sandbox"):
        run_python(reads, sandbox="jail")


@requires_bwrap
def test_default_mode_is_isolated():
    result = run_python(contained("open('/etc/passwd').read()"))
    assert result.mode == "bwrap" and result.passed


def test_missing_bwrap_runs_nothing_unless_the_user_asks(monkeypatch, tmp_path):
    """Without bubblewrap the default mode refuses, naming the cause, the package and the flag, and the program
    never runs (no marker written on the host); it never falls back to "rlimit" by itself. Asked for, it runs."""
    marker = tmp_path / "ran"
    program = f"open({str(marker)!r}, 'w').close()\n"
    monkeypatch.setenv("PATH", "/nonexistent")
    sandbox._probe.cache_clear()
    try:
        for _ in range(2):  # probed once, refused every time
            with pytest.raises(sandbox.SandboxUnavailable) as refused:
                run_python(program, timeout=5)
        message = str(refused.value)
        assert "\n" not in message and "no bwrap on PATH" in message
        assert "apt-get install bubblewrap" in message and "--unsafe-sandbox rlimit" in message
        assert not marker.exists()
        sandbox.allow_unsafe("rlimit")
        result = run_python(program, timeout=5)
    finally:
        sandbox._probe.cache_clear()
    assert result.mode == "rlimit" and result.passed and marker.exists()


# --- who chooses the mode: never a task file; the user, on the command line --------------------------------


def code_task(folder: Path, marker: Path, answer: dict) -> Path:
    """A code task whose data's test code writes `marker` on the host, if it ever runs unsandboxed."""
    import json

    import yaml

    row = {
        "task_id": "t/0",
        "prompt": "def f():\n",
        "canonical_solution": "    return 1\n",
        "test": f"def check(fn):\n    open({str(marker)!r}, 'w').close()\n    assert fn() == 1\n",
        "entry_point": "f",
    }
    (folder / "data.jsonl").write_text(json.dumps(row) + "\n")
    task = {
        "name": "hostile_code",
        "source": {"files": {"test": "data.jsonl"}},
        "fields": {"id": "task_id", "question": "prompt", "answer": "canonical_solution", "test": "test"},
        "splits": {"test": {"from": "test", "size": None}},
        "answer": answer,
        "generation": {"max_new_tokens": 4},
    }
    task["fields"]["entry_point"] = "entry_point"
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


@pytest.mark.parametrize("weaker", ["none", "rlimit"])
def test_a_task_file_cannot_choose_a_weaker_sandbox(tmp_path, weaker):
    """`answer: {type: code, sandbox: none}` once ran the data file's test code on the host, with no flag and
    no warning: now the task is refused in one line before anything runs (nor any model loads)."""
    from promptopt.tasks.catalog import load_task_spec
    from tests.clirun import assert_one_line_error, promptopt

    marker = tmp_path / "ran-on-the-host"
    path = code_task(tmp_path, marker, {"type": "code", "timeout": 5, "sandbox": weaker})
    with pytest.raises(ConfigError, match=f"answer.sandbox: expected 'bwrap' .*got '{weaker}'"):
        load_task_spec(str(path))
    run = promptopt("score", "--task", path, "--model", tmp_path / "no-such-model.gguf")
    assert_one_line_error(run, "answer.sandbox", "cannot weaken the code sandbox", "--unsafe-sandbox rlimit")
    assert not marker.exists()
    bwrap_task = code_task(tmp_path, marker, {"type": "code", "sandbox": "bwrap"})  # stating the default is fine
    assert load_task_spec(str(bwrap_task)).answer_type == "code"


def test_code_answers_without_bwrap_need_the_flag_which_warns_on_every_run(tmp_path, monkeypatch, tiny_llama_dir):
    """Without bubblewrap, `score` on a code task is one error line naming the package and the flag; with
    `promptopt --unsafe-sandbox rlimit` it runs, and says so first on stderr, every run."""
    from tests.clirun import assert_one_line_error, promptopt

    path = code_task(tmp_path, tmp_path / "marker", {"type": "code", "timeout": 5})
    command = ["score", "--task", path, "--model", tiny_llama_dir, "--device", "cpu", "--limit", "1", "--quiet"]
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap, whether or not this machine has it
    sandbox._probe.cache_clear()
    try:
        assert_one_line_error(promptopt(*command), "bubblewrap", "apt-get install bubblewrap", "--unsafe-sandbox")
        for _ in range(2):
            run = promptopt("--unsafe-sandbox", "rlimit", *command)
            assert run.code == 0, run.stderr
            assert run.stderr.splitlines()[0].startswith("warning: --unsafe-sandbox rlimit: code answers run with")
            sandbox.allow_unsafe(None)  # the in-process CLI leaves it set; a real process ends with it
    finally:
        sandbox._probe.cache_clear()
