"""Reliability of whole workflows: a compare killed at any phase resumes to the uninterrupted run's tables,
a finished compare rerun scores nothing, and what refuses a resume refuses it before any work.

Runs use the tiny random model with tiny limits; kills go through the PROMPTOPT_FAULT_SLEEP hook (see
tests/workflows/test_faults.py and promptopt/study/recovery.py `fault_point`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pandas as pd
import pytest

from tests.clirun import assert_one_line_error as assert_one_error_line
from tests.clirun import message_lines, promptopt
from tests.workflows.test_faults import Run, _env, assert_ok, assert_run_dir_parses, cli, kill_at, snapshot
from tests.workflows.test_full_disk import Disk, fill_at_checkpoint, standing_alone, temporaries, tmpfs

PLUMBING_SUITE = str(
    Path(__file__).resolve().parents[1] / "suites" / "plumbing.yaml"
)  # no WordNet, no LM: processes start fast
COMPARE = [
    "compare",
    "--task",
    "sst2",
    "--trials",
    "2",
    "--dev-limit",
    "8",
    "--test-limit",
    "6",
    "--robust-limit",
    "3",
    "--suite",
    PLUMBING_SUITE,
    "--top-n",
    "1",
    "--device",
    "cpu",
    "--incumbent",  # every search ships its own winner, so each phase runs (a kept default prompt reuses the baseline's)
    "none",
    "--scan",
    "off",
]
TABLES = ("compare.csv", "compare_paired.csv", "compare_runs.csv")
WALL = ("search_seconds", "search_seconds_sd")


@pytest.fixture(scope="module")
def model(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, model) -> Path:
    """An uninterrupted compare."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert_ok(cli(*COMPARE, "--model", model, "--out", str(out)))
    return out


def tables(out: Path, drop=WALL) -> dict[str, pd.DataFrame]:
    """The compare's tables with trial numbers as ordinals: Optuna gives a retry a new number, so a resumed
    study's numbers shift by one per retry, while a trial's `ordinal` (its place in the sampled sequence) is
    the uninterrupted run's."""
    studies = {s.study_name: s for s in optuna.get_all_study_summaries(f"sqlite:///{out / 'study.db'}")}
    ordinals = {}
    for name in studies:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")
        ordinals[name.split("-", 1)[1]] = {t.number: t.user_attrs.get("ordinal") for t in study.trials}

    def as_ordinals(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        for i, row in frame.iterrows():
            mapping = ordinals.get(row["strategy"], {})
            if "trial" in frame and not pd.isna(row["trial"]):
                frame.loc[i, "trial"] = mapping[int(row["trial"])]
            if "card" in frame:  # the card's path, inside this run directory
                frame.loc[i, "card"] = str(row["card"]).replace(str(out), "<out>")
            frame.loc[i, "selected_by"] = re.sub(
                r"#(\d+)", lambda m, o=mapping: f"#ordinal{o[int(m[1])]}", str(row["selected_by"])
            )
        return frame

    frames = {name: pd.read_csv(out / name) for name in TABLES}
    frames = {name: as_ordinals(frame) if "selected_by" in frame else frame for name, frame in frames.items()}
    return {name: frame.drop(columns=[c for c in drop if c in frame.columns]) for name, frame in frames.items()}


def assert_same_tables(a: Path, b: Path, drop=WALL) -> None:
    """Every count, label, prediction and trial exact; float columns within 1e-5 relative: a resumed run scores
    what is left in other batches than the whole run did (some rows come from the killed run's cache), and a
    row's float32 hidden state, hence its δ_TCB, moves in the 7th digit with the batch's padded width."""
    for name, frame in tables(a, drop).items():
        pd.testing.assert_frame_equal(tables(b, drop)[name], frame, check_exact=False, rtol=1e-5, atol=1e-9, obj=name)


@pytest.mark.long
def test_compare_killed_at_every_phase_resumes_to_the_uninterrupted_tables(whole, model, tmp_path):
    """One compare directory killed in turn during a prompt's robustness, before a study, during a study's
    first trial and before a winner's test scoring, each time resumed with --resume: it ends with the tables
    of the compare that was never interrupted."""
    out = tmp_path / "run"
    compare = [*COMPARE, "--model", model, "--out", str(out)]
    kill_at(compare, "compare-robust", nth=2)  # the baseline stressed, the first study's winner half-way
    assert (out / "study.db").exists() and not (out / "compare.csv").exists()
    assert_readers_refuse(out, whole, tmp_path)  # no table yet: a compare all the same, and an interrupted one
    for phase in ("compare-search", "trial", "compare-test"):  # the 2nd study not started; in its trial; its winner
        kill_at([*compare, "--resume"], phase, nth=2 if phase == "compare-search" else 1)
        assert_run_dir_parses(out / "ppl")
    resumed = cli(*compare, "--resume")
    assert_ok(resumed)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluations_resumed"] >= 2 and len(summary["studies_resumed"]) == 2
    assert_same_tables(whole, out)
    runs = pd.read_csv(out / "compare_runs.csv")
    assert (runs["trial"] != pd.read_csv(whole / "compare_runs.csv")["trial"]).any()  # the retry shifted a number


@pytest.mark.long
def test_a_compare_whose_study_cannot_fold_its_log_is_one_line_then_resumes_to_the_tables(whole, model, tmp_path):
    """The disk fills as the compare's first study is about to fold its write-ahead log into study.db: one line,
    exit 2, no 'wrote'; with room, --resume ends with the uninterrupted compare's tables and a study.db (all
    three studies) that stands alone."""
    with tmpfs(tmp_path / "disk", "16m") as path:
        disk, out = Disk(path), path / "run"
        with pytest.MonkeyPatch.context() as patch:
            fill_at_checkpoint(patch, disk)
            run = promptopt(*COMPARE, "--model", model, "--out", out)
        assert_one_error_line(
            run, f"error: cannot fold the write-ahead log into {out / 'study.db'} (database or disk is full): "
        )
        assert "wrote" not in run.stdout and "Traceback" not in run.stderr and temporaries(path) == []
        assert not (out / "compare.csv").exists()
        disk.grow()
        resumed = promptopt(*COMPARE, "--model", model, "--out", out, "--resume")
        assert resumed.code == 0, resumed.stderr
        assert "wrote" in resumed.stdout and temporaries(path) == []
        alone = standing_alone(out / "study.db", tmp_path / "alone")
        assert len(optuna.get_all_study_summaries(alone)) == 3
        assert_same_tables(whole, out)


def assert_readers_refuse(out: Path, whole: Path, tmp_path: Path) -> None:
    """report, export (the dev winner, --select robust, --ensemble) and pair (either side) each refuse `out`'s
    incomplete table set in the same one line, and write nothing."""
    refused = (
        f"error: {out}: its tables are not a complete set (no tables.json): the compare was interrupted while writing "
        "them, or wrote them before promptopt kept table sets; finish it with `promptopt compare ... --resume`"
    )
    card = tmp_path / "card.yaml"
    for command in (
        ["report", out, "--out", tmp_path / "report.html"],
        ["export", out, "--out", card],
        ["export", out, "--out", card, "--select", "robust"],
        ["export", out, "--out", card, "--ensemble", "2"],
        ["pair", whole, out],
        ["pair", out, whole],
    ):
        run = promptopt(*command)
        assert_one_error_line(run, refused)
        assert run.stderr.strip() == refused, (command, run.stderr)
    assert not card.exists() and not (tmp_path / "report.html").exists()


@pytest.mark.long
def test_a_compare_stopped_between_its_tables_is_refused_then_resume_completes_the_set(whole, model, tmp_path):
    """The issue's two cases. kill -9 with compare.parquet's temporary made and nothing in it: compare.csv alone, an
    empty compare.parquet.*.tmp and no tables.json. The resume, Ctrl-C'd after it rewrote compare.csv: compare.csv
    alone again (the orphan removed before anything was written). Each time every reader refuses in one line; the
    next --resume completes the set: the uninterrupted compare's tables, no temporary left."""
    from promptopt.study.tableset import check_table_set
    from tests.study.test_table_sets import temporaries

    out = tmp_path / "run"
    compare = [*COMPARE, "--model", model, "--out", str(out)]
    kill_at(compare, "compare-table-write", nth=2)  # compare.csv in place, compare.parquet's temporary just made
    (orphan,) = out.glob("compare.parquet.*.tmp")
    assert orphan.stat().st_size == 0 and (out / "compare.csv").is_file()
    assert not any((out / n).exists() for n in ("compare.parquet", "compare_runs.csv", "summary.json", "tables.json"))
    assert_readers_refuse(out, whole, tmp_path)
    stopped = Run(*compare, "--resume", PROMPTOPT_FAULT_SLEEP="compare-tables:120")
    stopped.wait_for("fault-point compare-tables")
    stopped.proc.send_signal(signal.SIGINT)
    stopped.finish()
    assert stopped.code == 130 and "interrupted" in stopped.stderr, stopped.stderr
    assert temporaries(out) == [] and (out / "compare.csv").is_file() and not (out / "compare.parquet").exists()
    assert_readers_refuse(out, whole, tmp_path)
    assert_ok(cli(*compare, "--resume"))
    assert temporaries(out) == []
    files = [f["name"] for f in check_table_set(out, "compare")["files"]]
    assert files == [
        "compare.csv",
        "compare.parquet",
        "compare_runs.csv",
        "compare_paired.csv",
        "robustness_items.parquet",
        "test_items.parquet",
        "summary.json",
    ]
    assert_same_tables(whole, out)
    paired = promptopt("pair", whole, out)
    assert paired.code == 0, paired.stderr


@pytest.mark.long
def test_finished_compare_rerun_reuses_everything_and_scores_nothing(whole, model, tmp_path):
    """--resume on a finished compare: every study and evaluation reused, no result-cache miss, no
    evaluation file rewritten, the same tables. Without --resume: one line, before any scoring."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    stored = snapshot(out / "evaluations")
    fresh = promptopt(*COMPARE, "--model", model, "--out", out, env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"})
    assert_one_error_line(fresh, "has already started (study 'sst2-ppl' exists", "pass --resume")
    rerun = promptopt(
        *COMPARE, "--model", model, "--out", out, "--resume", env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"}
    )
    assert rerun.code == 0, rerun.stderr
    assert "fault-point compare-test" not in rerun.stderr  # no prompt scored on the test items
    summary = json.loads((out / "summary.json").read_text())
    assert summary["result_cache_misses"] == 0 and summary["result_cache_hits"] > 0
    assert summary["evaluations_resumed"] == summary["evaluations"] > 0
    assert len(summary["studies_resumed"]) == 3
    assert "0 misses" in rerun.stdout
    assert snapshot(out / "evaluations") == stored
    assert_same_tables(whole, out)
    walls = [
        pd.read_csv(run / "compare.csv").set_index("strategy")["search_seconds"].drop("baseline")
        for run in (whole, out)
    ]
    assert (walls[1] >= walls[0]).all() and (walls[0] > 0).all()  # a reused study keeps its search's seconds


@pytest.mark.long
def test_compare_resume_refuses_a_changed_study_before_any_work(whole, model, tmp_path):
    """A resume whose studies would mean something else is refused in one line before the baseline is
    scored or stressed; a study that is missing is created (and the finished ones reused)."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    before = snapshot(out)
    changed = promptopt(
        *[a if a != "8" else "6" for a in COMPARE],
        "--model",
        model,
        "--out",
        out,
        "--resume",
        env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"},
    )
    assert_one_error_line(
        changed, "--resume: study 'sst2-ppl' was created with dev_limit=8 but this run has dev_limit=6"
    )
    assert "fault-point" not in changed.stderr
    assert snapshot(out) == before
    more = promptopt(*COMPARE, "--strategies", "ppl,tcb,accuracy,acc_ppl", "--model", model, "--out", out, "--resume")
    assert more.code == 0, more.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["studies_resumed"]) == ["sst2-accuracy", "sst2-ppl", "sst2-tcb"]
    assert (out / "acc_ppl" / "best_card.yaml").exists()


def test_an_over_long_card_prompt_names_the_card(model, tmp_path):
    """score/evaluate with a card whose prompt does not fit the model: one line naming the card file."""
    from promptopt.prompts import save_card
    from promptopt.tasks import load_task

    prompt = load_task("sst2").default_prompt()
    card = tmp_path / "long_card.yaml"
    save_card(prompt.with_(instruction="Read the review very carefully. " * 400), card)
    for command in (["score", "--limit", "2"], ["evaluate", "--suite", PLUMBING_SUITE, "--limit", "2"]):
        run = promptopt(*command, "--task", "sst2", "--model", model, "--device", "cpu", "--prompt", card)
        assert_one_error_line(run, f"card {card}: item ", "tokens but model")


def test_a_prompt_too_long_for_the_model_names_the_items_file_line_and_field(model, tmp_path):
    """A task whose items do not fit the model: the one line names the data file and line, the field the item's
    text comes from and its length, and the item."""
    rows = [{"text": f"review {i}: " + "a long and winding sentence " * 150, "label": i % 2} for i in range(8)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = {
        "name": "t",
        "source": {"files": {"validation": "data.jsonl"}},
        "splits": {
            "seed": 3,
            "pool": {"from": "validation", "size": 2},
            "dev": {"from": "validation", "size": 2},
            "test": {"from": "validation"},
        },
        "answer": {"type": "multiple_choice"},
        "fields": {"question": "text", "choices": ["negative", "positive"], "answer": "label"},
    }
    (tmp_path / "task.yaml").write_text(json.dumps(task))
    run = promptopt("score", "--task", tmp_path / "task.yaml", "--model", model, "--device", "cpu", "--limit", "2")
    assert_one_error_line(run)
    line = message_lines(run.stderr)[0]
    match = re.fullmatch(
        rf"error: item (\S+): prompt is \d+ tokens but model .+ takes 512 \({re.escape(str(data))} line (\d+), "
        r"fields\.question: ([\d,]+) characters\)",
        line,
    )
    assert match, line
    item, number, length = match[1], int(match[2]), int(match[3].replace(",", ""))
    assert length == len(rows[number - 1]["text"]) and item.startswith("validation-")


@pytest.mark.long
def test_a_space_whose_longest_shot_does_not_fit_names_that_pool_item(model, tmp_path):
    """One 1 MB pool item: the search's one line names it (its id, file line and size) beside the short query item
    the scorer measured (issue 53: only the 26-character query was named)."""
    huge = "a long and winding sentence " * 36_000  # ~1 MB
    pool = [{"text": huge if i == 1 else f"pool review {i}", "label": i % 2} for i in range(4)]
    rows = [{"text": f"review {i}: fine", "label": i % 2} for i in range(8)]
    for name, table in (("pool.jsonl", pool), ("data.jsonl", rows)):
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in table))
    task = {
        "name": "t",
        "source": {"files": {"train": "pool.jsonl", "validation": "data.jsonl"}},
        "splits": {"pool": {"from": "train"}, "dev": {"from": "validation", "size": 4},
                   "test": {"from": "validation"}},
        "answer": {"type": "multiple_choice"},
        "fields": {"question": "text", "choices": ["negative", "positive"], "answer": "label"},
        "prompt": {"k": 0, "template": {"query": "Review: {question}\nSentiment:"}},
    }  # fmt: skip
    (tmp_path / "task.yaml").write_text(json.dumps(task))
    (tmp_path / "space.yaml").write_text(
        'task: t\ninstructions: {none: ""}\nexemplars: {candidates: 4, k: [1, 1]}\n'
        'templates: {qa: {query: "Review: {question}\\nSentiment:"}}\n'
    )
    run = promptopt(
        "search", "--task", tmp_path / "task.yaml", "--space", tmp_path / "space.yaml", "--model", model,
        "--device", "cpu", "--trials", "1", "--out", tmp_path / "run",
    )  # fmt: skip
    assert_one_error_line(run, "does not fit", "its longest shot is pool item ")
    line = message_lines(run.stderr)[0]
    size = len(huge) + len("positive") + len("negative") + len("positive")  # question, its answer, the choices
    assert f"({tmp_path / 'pool.jsonl'} line 2, {size:,} characters)" in line, line
    assert not (tmp_path / "run" / "study.db").exists()


# --- a full disk, a forbidden folder, two runs at once -----------------------------------------------------
SEARCH = [
    "search",
    "--strategy",
    "tcb",
    "--task",
    "sst2",
    "--dev-limit",
    "4",
    "--test-limit",
    "2",
    "--minibatch",
    "4",
    "--trials",
    "2",
    "--device",
    "cpu",
]


@pytest.fixture
def small_disk(tmp_path):
    """`make(free)`: a 2 MiB tmpfs holding a filler file that leaves `free` bytes; unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small tmpfs needs root (mount -t tmpfs)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {done.stderr.strip()}")

    def make(free: int = 0) -> Path:
        filler = mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        os.truncate(filler, max(0, filler.stat().st_size - free))
        return mount

    yield make
    subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def finished_search(tmp_path_factory, model) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert promptopt(*SEARCH, "--model", model, "--out", out).code == 0
    return out


def left_on(disk: Path) -> list[str]:
    return sorted(str(p.relative_to(disk)) for p in disk.rglob("*") if p.name != "filler")


@pytest.mark.long
def test_a_full_disk_is_one_line_and_leaves_nothing_for_every_out(small_disk, model, finished_search):
    """score, search, compare, evaluate, export (card and lm-eval's two files) and report with --out on a full
    file system: exit 2, one `error:` line naming what could not be written, nothing left on the disk
    (search: not even the study.db it had just created)."""
    disk = small_disk(0)
    common = ["--model", model, "--device", "cpu"]
    cases = [
        (["score", "--task", "sst2", "--limit", "2", *common, "--out", disk / "s.parquet"], "cannot write"),
        ([*SEARCH, "--model", model, "--out", disk / "run"], "study.db"),
        ([*COMPARE, "--model", model, "--strategies", "ppl", "--out", disk / "cmp"], "cannot write"),
        (
            ["evaluate", "--task", "sst2", "--suite", PLUMBING_SUITE, "--limit", "2", *common, "--out", disk / "ev"],
            "cannot write",
        ),
        (
            ["export", finished_search, "--out", disk / "card.yaml"],
            f"cannot write {disk / 'card.yaml'}: No space left on device",
        ),
        (["export", finished_search, "--format", "lm-eval", "--out", disk / "task.yaml"], "No space left on device"),
        (
            ["report", finished_search, "--out", disk / "report.html"],
            f"cannot write {disk / 'report.html'}: No space left",
        ),
    ]
    for args, fragment in cases:
        run = promptopt(*args)
        assert_one_error_line(run, fragment)
        assert "Traceback" not in run.stderr
        assert left_on(disk) == [], (args[0], left_on(disk))


@pytest.mark.parametrize("free", [120_000, 220_000])
def test_a_disk_that_fills_during_a_search_leaves_no_half_built_study(small_disk, model, free):
    """Room for the schema but not for the trials (or for part of the schema): one line, and a study.db that
    holds no finished trial is removed with the run directory this run created."""
    disk = small_disk(free)
    run = promptopt(*SEARCH, "--model", model, "--out", disk / "run")
    assert_one_error_line(run, "database or disk is full")
    assert left_on(disk) == []


def test_an_out_whose_parent_may_not_be_entered_is_one_line():
    """A non-root user (here: root's child process after setuid to nobody) whose --out lies under a folder it
    may not enter: `check_output` fails in one line instead of a PermissionError traceback from stat."""
    from promptopt.errors import UserError
    from promptopt.yamlio import check_output

    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    with tempfile.TemporaryDirectory(dir="/tmp") as root:  # pytest's own folder is closed to other users
        os.chmod(root, 0o755)
        locked = Path(root) / "locked"
        (locked / "inner").mkdir(parents=True)
        locked.chmod(0o700)
        message, code = _as_nobody(lambda: check_output(locked / "inner" / "run", folder=True, what="--out"), UserError)
    assert code == 2, message
    assert message == f"--out {locked / 'inner' / 'run'}: cannot enter {locked} (permission denied)"


def _as_nobody(call, expected) -> tuple[str, int]:
    """Run `call` in a forked child as uid/gid 65534: (its error message, 2 for `expected`, 1 otherwise, 0 if none)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, then the check
        os.close(read)
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            call()
            code = 0
        except expected as exc:
            os.write(write, str(exc).encode())
            code = 2
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(write, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(code)
    os.close(write)
    message = os.read(read, 4096).decode()
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return message, os.waitstatus_to_exitcode(status)


READ_ONLY = (
    "error: study.db is read-only: {db} cannot be written, and a search records its trials there; make it "
    "writable, or copy the run directory and run --resume on the copy"
)


@pytest.mark.long
def test_a_read_only_study_db_in_a_writable_folder_is_one_line_and_leaves_no_file(model, finished_search, tmp_path):
    """search --resume on a study.db that may not be written (a read-only bind of the file, or chmod a-w as
    another user) beside files that may: one line, exit 2, and the run directory exactly as it was (SQLite,
    left to find out at the first trial's write, reported a lost storage and left new -wal / -shm files)."""
    out = tmp_path / "run"
    shutil.copytree(finished_search, out)
    db = out / "study.db"
    if os.geteuid() != 0:
        db.chmod(0o444)
        wrap: list[str] = []
    else:  # root writes whatever the mode says: a read-only bind mount of the file, in a mount namespace of its own
        bwrap = shutil.which("bwrap")
        wrap = [bwrap or "bwrap", "--dev-bind", "/", "/", "--ro-bind", str(db), str(db)]
        if not bwrap or subprocess.run([*wrap, "true"], capture_output=True).returncode != 0:
            pytest.skip(
                "as root, a read-only study.db needs bubblewrap able to bind it read-only (apt-get install bubblewrap)"
            )
    before = snapshot(out)
    search = [*SEARCH, "--model", model, "--out", str(out), "--resume", "--trials", "3"]
    proc = subprocess.run(
        [*wrap, sys.executable, "-m", "promptopt", *search],
        cwd=Path(__file__).resolve().parents[2],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [READ_ONLY.format(db=db)]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in finished_search.iterdir())
    assert snapshot(out) == before


def test_a_study_db_another_user_may_not_write_is_refused_before_sqlite_opens_it():
    """As a user without write permission on study.db (its folder writable): the storage is refused with the
    read-only line, and SQLite never opened the file (no -wal / -shm appear)."""
    from promptopt.errors import StorageError
    from promptopt.study import SearchConfig
    from promptopt.study.storage import make_storage

    if os.geteuid() != 0:
        pytest.skip("needs root to become another user")
    with tempfile.TemporaryDirectory(dir="/tmp") as root:  # pytest's own folder is closed to other users
        os.chmod(root, 0o755)
        out = Path(root) / "run"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        config = SearchConfig.build(task="sst2", out=str(out), device="cpu")
        optuna.create_study(study_name="s", storage=config.storage_url)  # study.db, owned by root
        db = out / "study.db"
        db.chmod(0o644)
        message, code = _as_nobody(lambda: make_storage(config), StorageError)
        assert (message, code) == (READ_ONLY.format(db=db).removeprefix("error: "), 2)
        assert sorted(p.name for p in out.iterdir()) == ["study.db"]


@pytest.mark.long
def test_two_searches_started_at_once_on_one_out(model, tmp_path):
    """Both pass the checks before either has created the study (the fault hook holds each just before it
    creates the storage): one runs, the other gets the 'already exists / pass --resume' line."""
    out = tmp_path / "run"
    runs = [
        Run(*SEARCH, "--model", model, "--out", str(out), PROMPTOPT_FAULT_SLEEP="create-storage:4") for _ in range(2)
    ]
    for run in runs:
        run.finish()
    codes = sorted(run.code for run in runs)
    assert codes == [0, 2], [run.stderr for run in runs]
    loser = next(run for run in runs if run.code == 2)
    assert_one_error_line(loser, "study 'sst2-tcb' already exists in", "pass --resume")


def test_a_schema_set_up_by_another_process_at_the_same_moment_is_retried(monkeypatch, tmp_path):
    """Optuna's schema set-up raced by another process fails with IntegrityError on alembic_version once;
    opening the storage again then finds the schema."""
    from optuna import storages

    from promptopt.study import SearchConfig
    from promptopt.study.storage import make_storage

    real, calls = storages.RDBStorage, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num")
        return real(*args, **kwargs)

    monkeypatch.setattr(storages, "RDBStorage", flaky)
    config = SearchConfig.build(task="sst2", out=str(tmp_path / "run"))
    assert make_storage(config) is not None and len(calls) == 2


@pytest.mark.long
def test_pair_reproduces_the_compares_own_paired_numbers(whole, tmp_path):
    """`promptopt pair` rebuilds the winners from what a compare wrote. Pairing the compare with a copy whose ppl and
    tcb labels are swapped must give, for ppl, exactly the compare's own ppl − tcb row (same bootstrap seed), and
    0 with p = 1 for a strategy paired with itself."""
    from promptopt.errors import UserError
    from promptopt.workflows.pair_runs import pair_runs
    from tests.study.test_table_sets import reseal

    swapped, swap = tmp_path / "swapped", {"ppl": "tcb", "tcb": "ppl"}
    shutil.copytree(whole, swapped)
    (swapped / "ppl").rename(swapped / "swap")
    (swapped / "tcb").rename(swapped / "ppl")
    (swapped / "swap").rename(swapped / "tcb")
    runs = pd.read_csv(whole / "compare_runs.csv")
    distinct = runs["strategy"].map(
        {"baseline": None, "accuracy": 0.125, "ppl": 0.25, "tcb": 0.375}
    )  # each winner's own dev number
    runs.assign(strategy=runs["strategy"].replace(swap), dev_accuracy=distinct).to_csv(
        swapped / "compare_runs.csv", index=False
    )
    items = pd.read_parquet(whole / "robustness_items.parquet")
    items.assign(strategy=items["strategy"].replace(swap)).to_parquet(swapped / "robustness_items.parquet")
    answers = pd.read_parquet(whole / "test_items.parquet")
    answers.assign(strategy=answers["strategy"].replace(swap)).to_parquet(swapped / "test_items.parquet")
    for table in swapped.glob("*/best_test_items.parquet"):  # the compare's own table of every winner is what pairs,
        table.unlink()  # whichever trial won (`--select robust`: not the best)
    swapped_runs = pd.read_csv(swapped / "compare_runs.csv")
    swapped_runs.assign(trial=swapped_runs["trial"] + 1).to_csv(swapped / "compare_runs.csv", index=False)
    reseal(swapped)  # changed on purpose: sealed again as a complete set
    table = pair_runs(whole, swapped, seed=1234).set_index("strategy")
    own = pd.read_csv(whole / "compare_paired.csv")
    row = own[(own["a"] == "ppl") & (own["b"] == "tcb")].iloc[0]
    keys = [c for c in own.columns if c.startswith(("delta_", "only_", "mcnemar", "n_pairs"))]
    assert keys and len(keys) > 8
    for key in keys:
        assert table.loc["ppl", key] == pytest.approx(row[key], nan_ok=True), key
    correct = {s: pd.read_parquet(whole / s / "best_test_items.parquet")["correct"].mean() for s in ("ppl", "tcb")}
    assert table.loc["ppl", "delta_acc"] == pytest.approx(correct["ppl"] - correct["tcb"])  # by hand
    assert table.loc["accuracy", "delta_acc"] == 0 and table.loc["accuracy", "mcnemar_p"] == 1.0
    dev = runs[runs["winner"]].set_index("strategy")["dev_accuracy"]
    assert [table.loc[s, "dev_accuracy_a"] for s in ("accuracy", "ppl", "tcb")] == [
        dev["accuracy"],
        dev["ppl"],
        dev["tcb"],
    ]
    assert [table.loc[s, "dev_accuracy_b"] for s in ("accuracy", "ppl", "tcb")] == [
        0.125,
        0.375,
        0.25,
    ]  # swapped with the labels
    # a compare from before test_items.parquet pairs through its run directories' best-trial tables, and says
    # what to do when a winner is not its search's best trial (`--select robust`)
    old = tmp_path / "old"
    shutil.copytree(whole, old)
    (old / "test_items.parquet").unlink()
    reseal(old)
    assert pair_runs(whole, old, seed=1234).set_index("strategy").loc["ppl", "delta_acc"] == 0
    runs.assign(trial=runs["trial"].where(runs["strategy"] != "ppl", runs["trial"] + 1)).to_csv(
        old / "compare_runs.csv", index=False
    )
    reseal(old)
    with pytest.raises(
        UserError,
        match=r"the winner of ppl seed 0 is trial \d+, not its search's best trial .*predates test_items.parquet",
    ):
        pair_runs(whole, old)
    result = promptopt("pair", whole, swapped, "--out", tmp_path / "pair.csv")
    assert result.code == 0, result.stderr
    assert "McNemar" in result.stdout and pd.read_csv(tmp_path / "pair.csv").shape[0] == 3
    bad = promptopt("pair", whole, tmp_path)
    assert_one_error_line(bad, f"{tmp_path}: not a finished compare directory")
