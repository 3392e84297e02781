"""Fault injection: what survives kill -9, Ctrl-C, a lost storage, bad input and a changed config.

Runs go through the CLI in subprocesses on the tiny random model with small limits. A run is stopped at a
known point through the PROMPTOPT_FAULT_SLEEP=<phase>:<seconds>[:<n>] hook (promptopt/study/recovery.py:
`fault_point`), which prints `fault-point <phase>` on stderr and sleeps there (the n-th time). After every fault the run
is resumed and the study checked: no trial lost (each failed trial's parameters re-run), none counted
twice, nothing left RUNNING, and every file in the run directory parses.

PostgreSQL tests read PROMPTOPT_TEST_POSTGRES_URL (skipped when unset, failed when CI is set).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from tests.clirun import Result, promptopt
from tests.forked import ForkedProcess

REPO = Path(__file__).resolve().parents[2]
LIMITS = [
    "--task",
    "sst2",
    "--dev-limit",
    "12",
    "--test-limit",
    "4",
    "--minibatch",
    "4",
    "--device",
    "cpu",
    "--strategy",
    "tcb",
    # the trials' own kill-and-resume mechanics (the incumbent's and the scan's: test_kill_9_while_the_incumbent_or_the_scan_is_scored)
    "--incumbent",
    "none",
    "--scan",
    "off",
]
SPACE = REPO / "promptopt" / "search_spaces" / "sst2.yaml"

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- running the CLI ---------------------------------------------------------------------------------
def _env(**extra) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", **extra}
    env.pop("PROMPTOPT_FAULT_SLEEP", None)
    env.pop("PROMPTOPT_STORAGE", None)
    env.update(extra)
    return env


class Run:
    """A CLI process whose output is collected as it comes, so a test can wait for a fault point.

    By default the process is forked from a warm server (tests/forked.py: a real process, without the
    interpreter start and heavy imports); `fresh=True` execs a new interpreter."""

    def __init__(self, *args: str, fresh: bool = False, **env: str) -> None:
        self.forked = not fresh
        self.out: list[str] = []
        self.err: list[str] = []
        if self.forked:
            self.proc = ForkedProcess([*args], env=_env(**env), cwd=REPO)
            return
        # a runner started in the background (nohup ... &) ignores SIGINT, and children inherit that: restore
        # the default so the child's Python turns Ctrl-C into KeyboardInterrupt as in a terminal
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "promptopt", *args],
            cwd=REPO,
            env=_env(**env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self._readers = [
            threading.Thread(target=self._read, args=(s, lines), daemon=True)
            for s, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def wait_for(self, marker: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.stderr:
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {marker!r}: {self.stderr}"
            assert time.monotonic() < deadline, f"no {marker!r} within {timeout}s"
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> Run:
        self.proc.wait(timeout=timeout)
        if not self.forked:
            for reader in self._readers:
                reader.join(timeout=10)
        return self

    @property
    def code(self) -> int | None:
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return self.proc.read()[1] if self.forked else "".join(self.err)

    @property
    def stdout(self) -> str:
        return self.proc.read()[0] if self.forked else "".join(self.out)


def cli(*args: str, **env: str) -> Run:
    return Run(*args, **env).finish()


def assert_ok(run: Run) -> None:
    assert run.proc.returncode == 0, run.stderr


# the progress bar, the progress lines (`search: loading model ...`), the test hook's announcements, and the warning
# every run on these tests' 12 dev items rightly prints before it starts (the dev size's detectable difference)
_NOISE = re.compile(r"^(search \S+: +\d+%\||fault-point |(search|compare): |warning: \d+ dev items choose the winner)")


def message_lines(run: Run | Result) -> list[str]:
    """stderr without the progress bar (its \r-separated redraws), the progress lines and the fault-point
    announcements."""
    return [line for line in re.split(r"[\r\n]", run.stderr) if line.strip() and not _NOISE.match(line)]


def assert_one_error_line(run: Run | Result, *fragments: str) -> None:
    """Exit 2 and exactly one message line on stderr, starting with 'error:'."""
    lines = message_lines(run)
    assert run.code == 2, run.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# --- checking a study and a run directory --------------------------------------------------------------
def sqlite_url(out: Path) -> str:
    return f"sqlite:///{out.resolve() / 'study.db'}"


def load(url: str, name: str = "sst2-tcb") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def assert_nothing_lost_or_double(study: optuna.Study, budget: int, *, exact: bool = True) -> None:
    """Nothing RUNNING or WAITING; every failed trial's parameters re-run to the end (a skipped duplicate
    prompt is not re-run); the budget met (exactly, for one worker) by COMPLETE/PRUNED trials, each a
    distinct trial; the incumbent's trial, if any, once and outside the budget."""
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states and "WAITING" not in states, states
    assert len({t.number for t in trials}) == len(trials)
    assert sum("incumbent" in t.params for t in trials) <= 1, states  # the incumbent is scored once per study
    done = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED") and "incumbent" not in t.params]
    assert len(done) == budget if exact else budget <= len(done) <= budget + 1, states
    # a trial that failed before it sampled anything (a full disk as it started: its retry could not be queued) lost
    # nothing; the next trial samples its point (sampled_sequence holds the run to the uninterrupted one)
    for failed in (t for t in trials if t.state.name == "FAIL" and "duplicate_of" not in t.user_attrs and t.params):
        retries = [t for t in done if failed.number in t.system_attrs.get("retry_history", [])]
        assert len(retries) == 1, f"trial {failed.number} failed and was re-run {len(retries)} times: " + str(
            [(t.number, t.state.name, t.params.get("incumbent"), t.system_attrs.get("retry_history")) for t in trials]
        )
        assert failed.params.items() <= retries[0].params.items()  # what it had sampled, re-run (all of it, if any)


def assert_run_dir_parses(out: Path) -> None:
    """No half-written file: each one parses as what its name says."""
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = path.name
        if name.endswith(("-wal", "-shm", "-journal")):
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".yaml":
            assert isinstance(yaml.safe_load(path.read_text()), dict), path
        elif path.suffix == ".parquet":
            pd.read_parquet(path)
        elif path.suffix == ".csv":
            pd.read_csv(path)
        elif path.suffix in (".db", ".sqlite"):
            with sqlite3.connect(path) as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok", path
        else:
            raise AssertionError(f"unexpected file in the run directory: {path}")


def snapshot(root: Path) -> dict:
    """Every file's size and mtime, less what an SQLite database in WAL mode holds nothing in: its -shm index
    and an empty -wal log (a process that ended without closing the database leaves them; the next one to
    close it removes them). A -wal with frames in it counts: it is the study's newest rows."""

    def holds_nothing(p: Path) -> bool:
        return p.name.endswith("-shm") or (p.name.endswith("-wal") and p.stat().st_size == 0)

    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if not holds_nothing(p)
    }


# --- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, model) -> Path:
    """A finished two-trial search; tests copy it and continue from there."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert_ok(cli("search", *LIMITS, "--model", model, "--trials", "2", "--out", str(out)))
    return out


@pytest.fixture
def run_dir(base_run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base_run, out)
    return out


def postgres_url() -> str:
    url = os.environ.get("PROMPTOPT_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("CI"):
            pytest.fail("CI must provide PostgreSQL: .ci/run starts it and sets PROMPTOPT_TEST_POSTGRES_URL")
        pytest.skip("PROMPTOPT_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL and sets it)")
    return url


# --- kill -9, Ctrl-C ----------------------------------------------------------------------------------
def kill_at(search: list[str], phase: str, nth: int = 1) -> None:
    """Run `search` until the `nth` time it reaches the fault point `phase`, then kill -9 it."""
    run = Run(*search, PROMPTOPT_FAULT_SLEEP=f"{phase}:120:{nth}")
    run.wait_for(f"fault-point {phase}")
    run.proc.send_signal(signal.SIGKILL)
    run.finish()


@pytest.mark.long
def test_kill_9_during_a_trial_the_rescore_and_the_card_then_resume(run_dir, model):
    """One run directory, killed three times at three points, resumed each time; then a clean resume."""
    search = ["search", *LIMITS, "--model", model, "--out", str(run_dir), "--resume", "--trials", "4"]
    kill_at(search, "trial")  # trial 2 is RUNNING, heartbeat and all
    assert [t.state.name for t in load(sqlite_url(run_dir)).trials] == ["COMPLETE", "COMPLETE", "RUNNING"]
    assert_run_dir_parses(run_dir)
    start = time.monotonic()
    kill_at(search, "rescore")  # same host, process gone: trial 2 failed at once and re-run, then trial 4
    print(f"kill -9 -> resumed run reached the re-score in {time.monotonic() - start:.1f}s")
    study = load(sqlite_url(run_dir))
    assert study.trials[2].state.name == "FAIL" and study.trials[3].system_attrs["failed_trial"] == 2
    assert_nothing_lost_or_double(study, 4)
    assert_run_dir_parses(run_dir)
    kill_at(search, "card")  # budget met: straight to the outputs, killed between the trials table and the card
    assert_run_dir_parses(run_dir)
    assert_ok(cli(*search))
    study = load(sqlite_url(run_dir))
    assert_nothing_lost_or_double(study, 4)
    assert_run_dir_parses(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sum(summary["trials"].values()) == len(study.trials) == 5
    card = yaml.safe_load((run_dir / "best_card.yaml").read_text())
    assert card["provenance"]["trial"] == summary["best_trial"]
    assert {t.user_attrs["worker"].rsplit(":", 1)[-1] for t in study.trials} == {"0"}


@pytest.mark.long
def test_kill_9_before_the_log_is_folded_then_resume_leaves_a_study_db_that_stands_alone(run_dir, model, tmp_path):
    """Killed after its outputs, before SQLite's write-ahead log is folded into study.db: the newest trial lives
    in study.db-wal only, and together the two files are the study. The resume folds it: study.db alone then
    holds every trial, with no -wal or -shm beside it."""
    search = ["search", *LIMITS, "--model", model, "--out", str(run_dir), "--resume", "--trials", "3"]
    kill_at(search, "checkpoint")
    assert (run_dir / "study.db-wal").stat().st_size > 0  # looked at without opening it: a reader would fold it
    assert_ok(cli(*search))
    assert sorted(p.name for p in run_dir.glob("study.db*")) == ["study.db"]
    alone = tmp_path / "alone" / "study.db"
    alone.parent.mkdir()
    shutil.copy(run_dir / "study.db", alone)
    assert_nothing_lost_or_double(load(f"sqlite:///{alone}"), 3)


def test_trial_of_a_vanished_host_is_awaited_until_stale_then_rerun(run_dir, model):
    """Another machine's process died a moment ago: its trial still has a fresh heartbeat. When that trial
    alone would meet the budget, resume waits for it to go stale (grace period), fails it and re-runs it."""
    from promptopt.study import SearchConfig, run_search
    from promptopt.study.context import build_context
    from promptopt.study.storage import make_storage

    config = SearchConfig.build(
        task="sst2",
        strategy="tcb",
        model=model,
        device="cpu",
        dev_limit=12,
        test_limit=4,
        minibatch=4,
        out=str(run_dir),
        resume=True,
        trials=3,
        heartbeat_interval=1,
        grace_period=3,
        incumbent="none",  # as LIMITS made the study
        scan="off",
    )
    storage = make_storage(config)
    study = optuna.load_study(study_name="sst2-tcb", storage=storage)
    ctx = build_context(config, config.data.load())
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # "heartbeat is supposed to be used with Study.optimize": here it stands for one
        trial = study.ask()
    ctx.space.suggest(trial, ctx.candidates, ctx.data.spec)
    trial.set_user_attr("worker", "elsewhere:4242:0")
    storage.record_heartbeat(trial._trial_id)  # then that machine vanished
    run_search(config, show_progress=False)
    study = optuna.load_study(study_name="sst2-tcb", storage=sqlite_url(run_dir))
    vanished = study.trials[2]
    assert vanished.state.name == "FAIL"
    assert (vanished.datetime_complete - vanished.datetime_start).total_seconds() >= 3  # failed once stale
    assert len(study.trials) == 4  # no trial of its own sampled meanwhile: only the retry ran
    assert_nothing_lost_or_double(study, 3)


# --- lost storage (PostgreSQL behind a proxy the test cuts) ---------------------------------------------
class Proxy:
    """A TCP proxy (threads) in front of PostgreSQL; `cut()` closes it and every connection, as a dead
    server or network would."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        for sock in [self.server, *self.sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@pytest.fixture(scope="module")
def lost_storage(tmp_path_factory, model):
    """A search on PostgreSQL through a proxy that is cut during its first trial, then resumed with the URL
    in $PROMPTOPT_STORAGE: (the cut run, the resumed run, the run directory, the URL, the study name)."""
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url())
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    via_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    real = url.render_as_string(hide_password=False)
    name = f"lost-{os.getpid()}-{int(time.time())}"
    out = tmp_path_factory.mktemp("lost") / "run"
    search = ["search", *LIMITS, "--model", model, "--out", str(out), "--study-name", name, "--trials", "3"]
    cut = Run(*search, "--storage", via_proxy, PROMPTOPT_FAULT_SLEEP="trial:3")
    cut.wait_for("fault-point trial")
    proxy.cut()
    cut.finish()
    states_after_cut = [t.state.name for t in load(real, name).trials]
    start = time.monotonic()
    resumed = cli(*search, "--resume", PROMPTOPT_STORAGE=real)
    print(f"storage lost -> resumed run finished in {time.monotonic() - start:.1f}s")
    yield cut, states_after_cut, resumed, out, real, name
    optuna.delete_study(study_name=name, storage=real)


def test_storage_lost_mid_trial_is_one_line_and_resume_reruns_the_trial(lost_storage):
    cut, states_after_cut, resumed, out, url, name = lost_storage
    assert_one_error_line(cut, "error: lost the storage", "re-run by --resume")
    assert "Traceback" not in cut.stderr
    assert states_after_cut == ["RUNNING"]  # nobody could tell the storage otherwise
    assert_ok(resumed)
    study = load(url, name)
    assert study.trials[0].state.name == "FAIL"
    assert_nothing_lost_or_double(study, 3)
    assert_run_dir_parses(out)


def test_storage_password_is_never_written(lost_storage):
    """Given on the command line (the cut run) or in $PROMPTOPT_STORAGE (the resumed one), the URL's
    password appears in no written file, no study or trial attribute, and nothing printed."""
    from sqlalchemy.engine import make_url

    cut, _, resumed, out, url, name = lost_storage
    parsed = make_url(url)
    password = parsed.password
    assert password, "the test URL must carry a password"
    # when the password is also the user or database name, look for it where a URL would carry it
    needle = password if password not in f"{parsed.username} {parsed.database} {parsed.host}" else f":{password}@"
    for run in (cut, resumed):
        assert needle not in run.stdout + run.stderr
    assert "***" in (out / "config.json").read_text()
    for path in (p for p in out.rglob("*") if p.is_file()):
        assert needle.encode() not in path.read_bytes(), path
    study = load(url, name)
    storage = optuna.storages.get_storage(url)
    attrs = [study.user_attrs, storage.get_study_system_attrs(study._study_id)]
    attrs += [a for t in study.trials for a in (t.user_attrs, t.system_attrs)]
    assert needle not in json.dumps(attrs, default=str)


# --- Ctrl-C, then workers that join together ------------------------------------------------------------
@pytest.mark.long
def test_ctrl_c_then_two_workers_join_together(run_dir, model):
    """Ctrl-C: one 'interrupted' line, exit 130, the trial FAIL and its parameters queued. Then two
    processes join the study at the same moment: exactly one of them re-runs the queued trial, and they
    sample different points (their sampler seeds differ), each trial naming its worker host:pid:index."""
    interrupted = Run(
        "search",
        *LIMITS,
        "--model",
        model,
        "--out",
        str(run_dir),
        "--resume",
        "--trials",
        "3",
        PROMPTOPT_FAULT_SLEEP="trial:120",
    )
    interrupted.wait_for("fault-point trial")
    interrupted.proc.send_signal(signal.SIGINT)
    interrupted.finish()
    assert interrupted.code == 130, interrupted.stderr
    assert message_lines(interrupted) == ["interrupted"], interrupted.stderr
    study = load(sqlite_url(run_dir))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "FAIL", "WAITING"]
    assert study.trials[3].params == study.trials[2].params  # the interrupted trial's parameters, queued

    search = ["search", *LIMITS, "--model", model, "--out", str(run_dir), "--resume", "--trials", "8", "--no-pruning"]
    for run in [Run(*search), Run(*search)]:
        assert_ok(run.finish())
    study = load(sqlite_url(run_dir))
    assert_nothing_lost_or_double(study, 8, exact=False)  # the interrupted trial re-run once, by one of them
    assert_run_dir_parses(run_dir)
    sampled = [t for t in study.trials[2:] if t.state.name == "COMPLETE" and "retry_history" not in t.system_attrs]
    by_worker: dict[str, list] = {}
    for t in sampled:
        by_worker.setdefault(t.user_attrs["worker"], []).append(t.params)
    assert len(by_worker) == 2, by_worker.keys()  # host:pid:0 of each process
    assert all(w.count(":") == 2 and w.endswith(":0") for w in by_worker)
    first, second = by_worker.values()
    assert first[: len(second)] != second[: len(first)]  # not the same sequence
    with_keys = [json.dumps(p, sort_keys=True) for p in (t.params for t in sampled) if p.get("k", 0) > 0]
    assert len(with_keys) == len(set(with_keys)), "two trials evaluated the same exemplar keys"


def _study_db_config(tmp_path):
    """A config whose storage is study.db in tmp_path: what `make_storage` opens for every process."""
    from promptopt.study import SearchConfig

    return SearchConfig.build(task="sst2", model="unused", device="cpu", out=str(tmp_path), trials=3)


def _at_once(work, n: int = 4) -> None:
    """Run `work` in n threads started together, as n processes on one study (each opens its own storage)."""
    workers = [threading.Thread(target=work) for _ in range(n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_workers_joining_at_once_claim_each_queued_trial_once(tmp_path):
    """Four storages on one study.db (as four processes joining a study) claim 80 queued trials at once:
    each trial is claimed by exactly one of them. Optuna's claim is a read then a conditional write, made
    atomic by BEGIN IMMEDIATE on SQLite (without it, 11-22 of 60 trials were claimed twice here)."""
    from promptopt.study.storage import make_storage

    config = _study_db_config(tmp_path)
    study = optuna.create_study(study_name="queue", storage=make_storage(config))
    for i in range(80):
        study.enqueue_trial({"x": i})
    claims: list[int] = []

    def claim_until_empty() -> None:
        worker = optuna.load_study(study_name="queue", storage=make_storage(config))
        while (trial_id := worker._pop_waiting_trial_id()) is not None:
            claims.append(trial_id)

    _at_once(claim_until_empty)
    assert sorted(claims) == sorted(t._trial_id for t in study.get_trials()), "a queued trial claimed twice or never"
    assert {t.state.name for t in study.get_trials()} == {"RUNNING"}


def test_workers_recovering_at_once_requeue_each_abandoned_trial_once(tmp_path):
    """Four storages on one study.db (as four processes that each find the same abandoned trials at start)
    fail 40 RUNNING trials at once: each is failed by exactly one of them and queued for a retry once.
    Without BEGIN IMMEDIATE, 21-24 of the 40 were failed twice here, and 72-74 retries queued."""
    from promptopt.study.recovery import _fail_trial
    from promptopt.study.storage import make_storage

    config = _study_db_config(tmp_path)
    study = optuna.create_study(study_name="abandoned", storage=make_storage(config))
    abandoned = []
    for _ in range(40):
        trial = study.ask()
        trial.suggest_int("x", 0, 100)
        abandoned.append(trial._trial_id)
    failed_by: list[int] = []

    def recover_all() -> None:
        worker = optuna.load_study(study_name="abandoned", storage=make_storage(config))
        failed_by.extend(trial_id for trial_id in abandoned if _fail_trial(worker, trial_id))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's retry callback is experimental
        _at_once(recover_all)
    assert sorted(failed_by) == abandoned, "an abandoned trial failed twice or never"
    trials = study.get_trials()
    assert [t.state.name for t in trials].count("WAITING") == 40
    retried = sorted(t.params["x"] for t in trials if t.state.name == "WAITING")
    assert retried == sorted(t.params["x"] for t in trials if t.state.name == "FAIL")


def test_a_retry_that_fails_again_is_requeued_once(tmp_path):
    """A trial FAILed with its retry queued, the retry FAILed in turn with its own retry queued: nothing is lost,
    so recovering again and again queues nothing more (`failed_trial` of a retry of a retry names the first trial;
    `retry_history` names both)."""
    from promptopt.study.recovery import _enqueue_retry, _requeue_lost_retries
    from promptopt.study.storage import make_storage

    config = _study_db_config(tmp_path)
    study = optuna.create_study(study_name="retries", storage=make_storage(config))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's retry callback is experimental
        first = study.ask()
        first.suggest_int("x", 0, 100)
        study.tell(first, state=optuna.trial.TrialState.FAIL)
        _enqueue_retry(study, first._trial_id)
        retry = study.ask()  # the queued retry
        study.tell(retry, state=optuna.trial.TrialState.FAIL)
        _enqueue_retry(study, retry._trial_id)
        for _ in range(3):
            _requeue_lost_retries(study)
    states = [t.state.name for t in study.get_trials()]
    assert states == ["FAIL", "FAIL", "WAITING"], states
    assert study.get_trials()[-1].system_attrs["retry_history"] == [0, 1]


def test_worker_seeds():
    from promptopt.study.storage import worker_seed

    assert worker_seed(7, 0) == 7  # worker 0, in a new run or a resumed one: the seed itself, reproducible
    assert worker_seed(7, 1) == worker_seed(7, 1) != 7


# --- a resumed run is the uninterrupted run -------------------------------------------------------------
def sampled_sequence(study: optuna.Study) -> list[tuple]:
    """The study as the sampler saw it: every trial but those abandoned and re-run (a retry takes the place
    of the trial it replaces), as (state, duplicate_of, params, value)."""
    return [
        (t.state.name, t.user_attrs.get("duplicate_of"), t.params, t.value)
        for t in study.trials
        if t.state.name != "FAIL" or "duplicate_of" in t.user_attrs
    ]


@pytest.mark.long
def test_kill_9_anywhere_then_resume_gives_the_uninterrupted_run(tmp_path, model):
    """search --trials 8 --seed 5, killed during trial 3 (two trials done), resumed and killed before a
    trial sampled its parameters, resumed and killed before the card, resumed to the end: the same trials,
    parameters, values and winner as the run that was never interrupted (trial numbers shift by the retries)."""
    search = ["search", *LIMITS, "--model", model, "--trials", "8", "--seed", "5"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert_ok(cli(*search, "--out", str(whole)))
    kill_at([*search, "--out", str(cut)], "trial", nth=3)
    assert [t.state.name for t in load(sqlite_url(cut)).trials] == ["COMPLETE", "COMPLETE", "RUNNING"]
    kill_at([*search, "--out", str(cut), "--resume"], "ask", nth=3)  # the retry, trial 3, then killed before sampling
    assert load(sqlite_url(cut)).trials[-1].params == {}  # nothing stored: its retry must sample the same point
    kill_at([*search, "--out", str(cut), "--resume"], "card")
    assert_ok(cli(*search, "--out", str(cut), "--resume"))
    expected, got = load(sqlite_url(whole)), load(sqlite_url(cut))
    assert [t.state.name for t in got.trials].count("FAIL") == 2
    assert sampled_sequence(got) == sampled_sequence(expected)
    assert_nothing_lost_or_double(got, 8)
    summaries = [json.loads((out / "summary.json").read_text()) for out in (whole, cut)]
    assert summaries[0]["best_params"] == summaries[1]["best_params"]
    assert summaries[0]["test"] == summaries[1]["test"]
    cards = [yaml.safe_load((out / "best_card.yaml").read_text()) for out in (whole, cut)]
    for card, study in zip(cards, (expected, got)):  # trial numbers as ordinals: a retry's number is a new one
        ordinal = {t.number: t.user_attrs["ordinal"] for t in study.trials}
        provenance = card["provenance"]
        provenance.pop("created")
        provenance["trial"] = ordinal[provenance["trial"]]
        provenance["selection"] = re.sub(
            r"#(\d+)", lambda m, o=ordinal: f"ordinal {o[int(m[1])]}", provenance["selection"]
        )
    assert cards[0] == cards[1]


@pytest.mark.long
def test_a_prompt_is_evaluated_once_per_study(tmp_path, model):
    """A space of three prompts (k = 0, one instruction, three templates) and a budget of three: samples
    that decode to an evaluated prompt are skipped, not counted, and reported; the three finished trials are
    the three prompts. With a budget of five the space runs out and the search stops, with a note."""
    space = yaml.safe_load(SPACE.read_text())
    space["instructions"] = {"plain": "Classify it."}
    space["templates"] = dict(list(space["templates"].items())[:3])
    space["exemplars"] = {"candidates": 4, "k": [0, 0]}
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(space))
    out = tmp_path / "run"
    run = promptopt("search", *LIMITS, "--model", model, "--space", path, "--trials", "3", "--seed", "3", "--out", out)
    assert run.code == 0, run.stderr
    study = load(sqlite_url(out))
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    skipped = [t for t in study.trials if t.state.name == "FAIL"]
    assert len(done) == 3 and len({t.params["template"] for t in done}) == 3
    assert skipped and all(t.user_attrs["duplicate_of"] in {d.number for d in done} for t in skipped)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["duplicates_skipped"] == len(skipped)
    assert f"{len(skipped)} duplicate prompt{'s' if len(skipped) > 1 else ''} skipped" in run.stdout
    assert "instruction 'Classify it.' (plain)" in run.stdout  # the instruction's text, beside its key
    low, high = summary["test"]["accuracy_ci95"]  # the printed accuracies carry their Wilson intervals
    assert f"[{low:.3f}, {high:.3f}]" in run.stdout and 0 <= low <= summary["test"]["accuracy"] <= high <= 1
    assert_nothing_lost_or_double(study, 3)

    from promptopt.study.trial import MAX_DUPLICATES_IN_A_ROW

    run = promptopt("search", *LIMITS, "--model", model, "--space", path, "--trials", "5", "--resume", "--out", out)
    assert run.code == 0, run.stderr
    assert "note: stopped with 3 of 5 trials" in run.stderr
    study = load(sqlite_url(out))
    assert [t.state.name for t in study.trials].count("COMPLETE") == 3
    assert (
        json.loads((out / "summary.json").read_text())["duplicates_skipped"] == len(skipped) + MAX_DUPLICATES_IN_A_ROW
    )


# --- resume with a changed configuration ---------------------------------------------------------------
def test_resume_refuses_a_config_that_changes_trial_values(run_dir, model, tmp_path):
    before = (run_dir / "config.json").read_bytes()
    n_trials = len(load(sqlite_url(run_dir)).trials)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.read_text().replace("Review:", "Film review:", 1))
    assert space.read_text() != SPACE.read_text()
    search = [
        "search",
        "--model",
        model,
        "--out",
        str(run_dir),
        "--resume",
        "--trials",
        "3",
        "--task",
        "sst2",
        "--strategy",
        "tcb",
        "--device",
        "cpu",
    ]
    cases = [
        (["--dev-limit", "4", "--test-limit", "4", "--minibatch", "4"], "dev_limit=12 but this run has dev_limit=4"),
        (
            [*LIMITS[2:], "--strategy", "accuracy", "--study-name", "sst2-tcb"],
            "strategy='tcb' but this run has strategy='accuracy'",
        ),
        ([*LIMITS[2:], "--space", str(space)], "space_file_sha256="),
        ([*LIMITS[2:], "--dtype", "bfloat16"], "dtype='float32' but this run has dtype='bfloat16'"),
    ]
    for args, fragment in cases:
        assert_one_error_line(promptopt(*search, *args), "--resume: study 'sst2-tcb' was created with", fragment)
    assert (run_dir / "config.json").read_bytes() == before
    assert len(load(sqlite_url(run_dir)).trials) == n_trials


def test_identity_names_what_may_change(model):
    """Run-time settings may change on resume; what defines a trial's value may not."""
    from promptopt.study import SearchConfig
    from promptopt.study.context import build_context
    from promptopt.study.identity import check_resumable, identity

    base = SearchConfig.build(task="sst2", model=model, device="cpu", dev_limit=12, minibatch=4, out="unused")
    data = base.data.load()
    then = identity(build_context(base, data))
    for change in (
        {"seed": 9},
        {"minibatch": 2},
        {"n_workers": 3},
        {"batch_size": 4},
        {"trials": 50},
        {"pruning": False},
        {"test_limit": 2},
        {"storage": "postgresql://u:pw@h/db"},
        {"heartbeat_interval": 5},
    ):
        check_resumable("s", then, identity(build_context(base.replace(**change), data)))
    for change, field in (
        ({"dev_limit": 4}, "dev_limit"),
        ({"strategy": "ppl"}, "strategy"),
        ({"model": "other/model"}, "model"),
        ({"dtype": "float16"}, "dtype"),
    ):
        with pytest.raises(Exception, match=f"created with {field}="):
            check_resumable("s", then, identity(build_context(base.replace(**change), data)))


def test_resume_scrubs_a_password_left_by_an_older_version():
    from promptopt.study.identity import scrub_stored_config

    study = optuna.create_study()
    study.set_user_attr("config", json.dumps({"study": {"storage": "postgresql://u:hunter2@h/db", "seed": 1}}))
    scrub_stored_config(study)
    assert json.loads(study.user_attrs["config"]) == {"study": {"storage": "postgresql://u:***@h/db", "seed": 1}}


# --- bad input: one line, exit 2, nothing created --------------------------------------------------------
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, model, monkeypatch):
    import torch

    root = tmp_path / "root"
    root.mkdir()
    from promptopt.models.load import _resolve

    _, folder, filename = _resolve("smollm2-135m-instruct")
    gguf = Path(folder) / filename
    (root / "empty.gguf").write_bytes(b"")
    (root / "truncated.gguf").write_bytes(gguf.read_bytes()[:200_000])
    (root / "a_file").write_text("x")
    (root / "scores.parquet").mkdir()  # a directory with a table's name
    long_space = yaml.safe_load(SPACE.read_text())
    long_space["instructions"]["huge"] = "Read the review very carefully. " * 3000
    (root / "long.yaml").write_text(yaml.safe_dump(long_space))
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "cache.sqlite").write_bytes(b"this is not an SQLite database" * 100)
    run_dir = lambda name: str(root / name)  # noqa: E731
    search = ["search", *LIMITS, "--trials", "2"]
    cases = [
        (
            [*search, "--model", model, "--out", run_dir("r1"), "--minibatch", "0"],
            "minibatch: expected a positive integer, got 0",
        ),
        (
            [*search, "--model", model, "--out", run_dir("r2"), "--minibatch", "-2"],
            "minibatch: expected a positive integer, got -2",
        ),
        ([*search, "--model", str(root / "empty.gguf"), "--out", run_dir("r3")], "is empty"),
        ([*search, "--model", str(root / "truncated.gguf"), "--out", run_dir("r4")], "cannot read GGUF file"),
        ([*search, "--model", model, "--out", str(root / "a_file")], "is a file"),
        ([*search, "--model", model, "--out", run_dir("r5"), "--space", str(root / "long.yaml")], "instruction 'huge'"),
        ([*search, "--model", model, "--out", str(corrupt)], "delete it"),
        (
            ["score", "--task", "sst2", "--model", model, "--limit", "2", "--out", str(root / "scores.parquet")],
            "is a directory",
        ),
        (
            [
                "search",
                *LIMITS,
                "--model",
                model,
                "--out",
                run_dir("r6"),
                "--storage",
                "postgresql://u:pw@127.0.0.1:1/x",
            ],
            "cannot open storage postgresql://u:***@127.0.0.1:1/x",
        ),
    ]
    cases.append(
        ([*search[:-4], "--model", model, "--out", run_dir("r8"), "--quantize", "3bit"], "expected 4bit or 8bit")
    )
    if not torch.cuda.is_available():
        cases.append(([*search, "--model", model, "--out", run_dir("r7"), "--device", "cuda"], "no CUDA device"))
    before = snapshot(root)
    monkeypatch.setenv("PROMPTOPT_CACHE", str(tmp_path / "model-cache"))
    for args, fragment in cases:
        assert_one_error_line(promptopt(*args), fragment)
    assert snapshot(root) == before  # no run directory, no study.db, no cache file, nothing touched
    assert not (tmp_path / "model-cache" / "models").exists() or not any(
        (tmp_path / "model-cache" / "models").iterdir()
    )


def test_out_on_a_read_only_file_system(tmp_path, model):
    """--out under a read-only mount (bubblewrap binds one) fails in one line before any work."""
    bwrap = shutil.which("bwrap")
    target = tmp_path / "ro"
    target.mkdir()
    probe = subprocess.run(
        [bwrap or "false", "--dev-bind", "/", "/", "--ro-bind", str(target), str(target), "true"], capture_output=True
    )
    if not bwrap or probe.returncode != 0:
        if os.geteuid() == 0:
            pytest.skip("needs bubblewrap with user namespaces to mount a read-only folder")
        target.chmod(0o555)
        wrap: list[str] = []
    else:
        wrap = [bwrap, "--dev-bind", "/", "/", "--ro-bind", str(target), str(target)]
    cmd = [*wrap, sys.executable, "-m", "promptopt", "search", *LIMITS, "--model", model, "--out", str(target / "run")]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: --out") and "read-only file system or permission denied" in lines[0]
    assert not any(target.iterdir())


@pytest.mark.parametrize("phase", ["incumbent", "scan"])
@pytest.mark.long
def test_kill_9_while_the_incumbent_or_the_scan_is_scored_then_resume(tmp_path, model, phase):
    """Killed after the incumbent was scored but before its trial was stored, or after the scan but before its record
    was: --resume scores what was lost once, keeps one incumbent trial and one scan record, and meets the budget."""
    limits = LIMITS[: LIMITS.index("--incumbent")]  # the defaults: the task's default prompt, the scan advising
    search = ["search", *limits, "--model", model, "--trials", "3", "--out", str(tmp_path / "run")]
    kill_at(search, phase)
    assert_ok(cli(*search, "--resume"))
    study = load(sqlite_url(tmp_path / "run"))
    incumbents = [t for t in study.trials if "incumbent" in t.params]
    assert len(incumbents) == 1 and incumbents[0].state.name == "COMPLETE"
    assert study.user_attrs["scan"]["verdict"]
    searched = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED") and "incumbent" not in t.params]
    assert len(searched) == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["incumbent"]["trial"] == incumbents[0].number and summary["scan"] == study.user_attrs["scan"]
