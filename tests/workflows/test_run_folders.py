"""Run folders and studies checked as cards are (issue 58, item 3): a storage URL masked whatever its shape, a run
folder whose files are garbage or forged refused in one line before any card is written, `--resume` after a kill
at any moment, and a killed worker's trial re-run at once.

Runs go through the CLI on the tiny random model (tests/conftest.py) with small limits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.clirun import promptopt
from tests.workflows.test_faults import LIMITS, assert_one_error_line

PASSWORD = "Hunter2-s3cr3t"
MALFORMED = [
    f"postgresql+psycopg2//optu:{PASSWORD}@127.0.0.1:55432/studies",  # no ':' after the scheme
    f"postgresql+psycopg2:/optu:{PASSWORD}@127.0.0.1:55432/studies",  # one '/'
    f"postgresql+psycopg2:optu:{PASSWORD}@127.0.0.1:55432/studies",  # no '/'
    f"optu:{PASSWORD}@127.0.0.1:55432/studies",  # no scheme
    f"postgresql+psycopg2://optu:{PASSWORD}/x@127.0.0.1:55432/studies",  # a '/' in the password
    f"postgresql+psycopg2://optu:{PASSWORD}@127.0.0.1:notaport/studies",  # a bad port
    f"postgresql+psycopg2:///studies?user=optu&password={PASSWORD}",  # in the query, nothing listening
]


@pytest.fixture(scope="module")
def model(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


# --- a storage URL, whatever its shape ------------------------------------------------------------------
@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_storage_url_never_prints_its_password(url, model, tmp_path):
    """Given with --storage or in $PROMPTOPT_STORAGE: one line naming the storage, the password masked (also in
    the message SQLAlchemy or the driver adds, which may quote the URL)."""
    search = ["search", *LIMITS, "--model", model, "--trials", "1"]
    for how, run in (
        ("flag", promptopt(*search, "--out", tmp_path / "a", "--storage", url)),
        ("env", promptopt(*search, "--out", tmp_path / "b", env={"PROMPTOPT_STORAGE": url})),
    ):
        assert_one_error_line(run, "error: cannot open storage ")
        assert PASSWORD not in run.stdout + run.stderr, (how, run.stderr)
        assert "***" in run.stderr, (how, run.stderr)


def test_redact_text_masks_a_quoted_url_and_keeps_what_is_not_a_password():
    from promptopt.study.config import redact, redact_text

    url = f"postgresql+psycopg2//optu:{PASSWORD} x@h/db"  # a space in the password: only `url` itself shows where
    message = f"Could not parse SQLAlchemy URL from string '{url}'"
    assert PASSWORD not in redact_text(message, url) and PASSWORD not in redact(url)
    assert redact_text(f"at 'postgresql://u:{PASSWORD}@h/db' and 'u2:{PASSWORD}@h'") == (
        "at 'postgresql://u:***@h/db' and 'u2:***@h'"
    )
    for kept in ("sqlite:////tmp/a@b/study.db", "postgresql://optu@h/db", "mail me at a@b.c", "no url here"):
        assert redact(kept) == kept and redact_text(kept) == kept


# --- a run folder's files: garbage or forged ------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(model, tmp_path_factory) -> Path:
    """A finished four-trial search (the tiny model): tests copy it and spoil one file."""
    out = tmp_path_factory.mktemp("run-folders") / "run"
    run = promptopt("search", *LIMITS, "--model", model, "--trials", "4", "--no-pruning", "--out", out, "--quiet")
    assert run.code == 0, run.stderr
    return out


def _copy(finished_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def _reseal(run: Path) -> None:
    """tables.json written again over the files as they are now: what a forger can do."""
    from promptopt.study.tableset import seal

    names = [f["name"] for f in json.loads((run / "tables.json").read_text())["files"]]
    seal(run, names, "search")


def _export_refused(run: Path, tmp_path: Path, *fragments: str) -> None:
    card = tmp_path / "card.yaml"
    result = promptopt("export", run, "--out", card)
    assert_one_error_line(result, *fragments)
    assert not card.exists() and not list(tmp_path.glob("card*"))


def test_export_writes_a_card_from_the_untouched_run(finished_run, tmp_path):
    """The companion: the checks pass on the run as the search wrote it."""
    run = _copy(finished_run, tmp_path)
    result = promptopt("export", run, "--out", tmp_path / "card.yaml")
    assert result.code == 0, result.stderr
    card = yaml.safe_load((tmp_path / "card.yaml").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert card["search"]["trial"] == summary["best_trial"] and card["search"]["winner"] is True


@pytest.mark.parametrize("name", ["splits.json", "summary.json", "config.json", "tables.json"])
@pytest.mark.parametrize("garbage", [b'{"task": "sst2", "pool": [', b"\xff\xfe not text", b"[1, 2]"])
def test_garbage_in_a_run_file_is_one_line_naming_it_and_no_card(finished_run, tmp_path, name, garbage):
    run = _copy(finished_run, tmp_path)
    (run / name).write_bytes(garbage)
    if name == "summary.json":
        _reseal(run)  # past the table set's check: the file itself is garbage
    _export_refused(run, tmp_path, str(run / name) if name != "tables.json" else "tables.json")
    if name != "splits.json":  # report reads the others
        report = promptopt("report", run, "--out", tmp_path / "report.md")
        assert_one_error_line(report, name)


def test_forged_splits_are_one_line_and_no_card(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    splits = json.loads((run / "splits.json").read_text())
    splits["test"] = splits["test"][1:] + splits["dev"][:1]  # a dev item claimed as held-out
    (run / "splits.json").write_text(json.dumps(splits))
    _export_refused(run, tmp_path, "splits.json", "test differ")


def _forge_winner(run: Path) -> int:
    """summary.json naming another finished trial as the winner (its parameters, its numbers), tables.json
    recomputed over it."""
    import optuna

    summary = json.loads((run / "summary.json").read_text())
    study = optuna.load_study(study_name=summary["study"], storage=f"sqlite:///{run / 'study.db'}")
    other = next(t for t in study.trials if t.state.name == "COMPLETE" and t.number != summary["best_trial"])
    summary["best_trial"], summary["best_params"] = other.number, other.params
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    _reseal(run)
    return other.number


def test_a_forged_winner_is_one_line_and_no_card(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    forged = _forge_winner(run)
    _export_refused(run, tmp_path, "summary.json", f"names trial {forged} as the winner")
    report = promptopt("report", run, "--out", tmp_path / "report.md")
    assert_one_error_line(report, "summary.json", f"names trial {forged}")
    assert not (tmp_path / "report.md").exists()


def test_a_forged_selection_text_is_one_line_and_no_card(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    summary["selection"] = "a clear winner: every other candidate is significantly worse"
    (run / "summary.json").write_text(json.dumps(summary, indent=1))
    _reseal(run)
    _export_refused(run, tmp_path, "summary.json", "selection text")


# --- --resume after a kill, whenever it came -----------------------------------------------------------------
MOMENTS = [
    ("create-storage", 1),  # checked, the model loaded, cache.sqlite made: no study.db yet
    ("storage-schema", 1),  # study.db claimed and empty: no tables, no study row (the finding: `no study ...`)
    ("study-row", 1),  # the study's row made, its config and identity not recorded
    ("ask", 2),  # one trial done, the next started before it sampled its parameters
    ("card", 1),  # the budget met, the trials table written, no card or summary
]


@pytest.mark.parametrize(("phase", "nth"), MOMENTS)
@pytest.mark.long
def test_a_search_killed_at_any_moment_resumes_or_starts_cleanly(phase, nth, model, tmp_path):
    """kill -9 at five moments of a new run, then `--resume`: it resumes the study or starts it, never refuses;
    the study ends with its budget met once, nothing RUNNING, and every file of the run directory parses."""
    from tests.workflows.test_faults import (
        assert_nothing_lost_or_double,
        assert_ok,
        assert_run_dir_parses,
        cli,
        kill_at,
        load,
        sqlite_url,
    )

    out = tmp_path / "run"
    search = ["search", *LIMITS, "--model", model, "--trials", "3", "--out", str(out)]
    kill_at(search, phase, nth)
    resumed = cli(*search, "--resume")
    assert_ok(resumed)
    assert "error" not in resumed.stderr
    assert_nothing_lost_or_double(load(sqlite_url(out)), 3)
    assert_run_dir_parses(out)
    assert (out / "tables.json").is_file() and (out / "best_card.yaml").is_file()


# --- a killed --n-workers worker -----------------------------------------------------------------------------
@pytest.mark.long
def test_a_killed_worker_is_noticed_at_once_and_its_trial_rerun(model, tmp_path):
    """`--n-workers 2` on the run's SQLite study: worker 1 is killed (kill -9) during its first trial. It stays a
    zombie of the run until joined, yet its trial is failed and re-run within seconds (not after the 60 s
    heartbeat grace); the run finishes (exit 0, one note), and no two trials that were not failed share an
    ordinal."""
    import os
    import re
    import signal
    import time

    from tests.workflows.test_faults import Run, assert_nothing_lost_or_double, load, sqlite_url

    out = tmp_path / "run"
    search = ["search", *LIMITS, "--model", model, "--trials", "6", "--no-pruning", "--n-workers", "2", "--out", out]
    run = Run(*map(str, search), PROMPTOPT_FAULT_SLEEP="trial:120", PROMPTOPT_FAULT_WORKER="1")
    run.wait_for("fault-point trial")
    pid = int(re.search(r"fault-point trial \(pid (\d+)\)", run.stderr).group(1))
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    run.finish(timeout=240)
    assert run.code == 0, run.stderr
    assert f"note: worker 1 (pid {pid}) was killed by SIGKILL; its trial was re-run" in run.stderr
    assert "leaked" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    study = load(sqlite_url(out))
    dead = [t for t in study.trials if t.user_attrs.get("worker", "").split(":")[1:2] == [str(pid)]]
    assert len(dead) == 1 and dead[0].state.name == "FAIL"
    retry = next(t for t in study.trials if t.system_attrs.get("failed_trial") == dead[0].number)
    assert retry.state.name == "COMPLETE"
    assert retry.datetime_start.timestamp() - killed_at < 15  # at once, not after the 60 s grace period
    assert_nothing_lost_or_double(study, 6, exact=False)
    live = [t.user_attrs["ordinal"] for t in study.trials if t.state.name != "FAIL"]
    assert len(live) == len(set(live)), live
    assert retry.user_attrs["ordinal"] == dead[0].user_attrs["ordinal"]  # a retry takes its trial's ordinal
