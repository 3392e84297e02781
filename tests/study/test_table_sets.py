"""The tables of one run are written as a set (promptopt/study/tableset.py): tables.json, written last, lists each
file's name, size and SHA-256; every reader (report, export, pair) refuses a set without it, or whose files do not
match it, in one line that says the run was interrupted and to --resume; a resume removes the temporaries a killed
writer left (promptopt/yamlio.py `remove_orphaned_temporaries`) and completes the set.

The library pieces are tested directly; a search is killed by fault injection (PROMPTOPT_FAULT_SLEEP, see
tests/workflows/test_faults.py) while a table's temporary file is open, then read and resumed through the CLI. The same for
a compare (kill -9 and Ctrl-C between its tables): tests/workflows/test_reliability.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from tests.workflows.test_faults import LIMITS, Run, assert_ok, cli

REPO = Path(__file__).resolve().parents[2]


def reseal(folder: Path) -> None:
    """Seal a set again as it is now (for tests that change a finished run's tables on purpose); files of the old
    manifest that are gone are left out."""
    from promptopt.study.tableset import MANIFEST, seal

    manifest = json.loads((folder / MANIFEST).read_text())
    seal(folder, [f["name"] for f in manifest["files"] if (folder / f["name"]).is_file()], manifest["kind"])


def temporaries(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp"))


# --- the set, written and checked ------------------------------------------------------------------------
def test_a_set_is_complete_only_with_its_manifest_and_files_that_match_it(tmp_path):
    from promptopt.errors import UserError
    from promptopt.study.tableset import MANIFEST, TableSet, check_table_set

    frame = pd.DataFrame({"strategy": ["a", "b"], "value": [[1, 2], {"k": 3}]})  # object cells become JSON text
    tables = TableSet(tmp_path, "compare").begin()
    tables.frame("compare.csv", frame)
    tables.frame("compare.parquet", frame)
    tables.text("summary.json", "{}")
    with pytest.raises(UserError) as unsealed:
        check_table_set(tmp_path, "compare")
    assert str(unsealed.value) == (
        f"{tmp_path}: its tables are not a complete set (no tables.json): the compare was interrupted while "
        "writing them, or wrote them before promptopt kept table sets; finish it with `promptopt compare ... --resume`"
    )
    tables.seal()
    manifest = check_table_set(tmp_path, "compare")
    assert [f["name"] for f in manifest["files"]] == ["compare.csv", "compare.parquet", "summary.json"]
    assert manifest["files"][2] == {
        "name": "summary.json",
        "bytes": 2,
        "sha256": "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    }
    assert pd.read_parquet(tmp_path / "compare.parquet")["value"].tolist() == ["[1, 2]", '{"k": 3}']
    (tmp_path / "summary.json").write_text("[]")  # same size, other bytes
    with pytest.raises(UserError, match=r"summary\.json does not match tables\.json \(its SHA-256 differs\): the "):
        check_table_set(tmp_path, "compare")
    (tmp_path / "summary.json").write_text("{ }")
    with pytest.raises(UserError, match=r"summary\.json does not match tables\.json \(3 bytes, 2 recorded\)"):
        check_table_set(tmp_path, "compare")
    (tmp_path / "summary.json").unlink()
    with pytest.raises(
        UserError, match=r"\(missing\): the compare was interrupted .*`promptopt compare \.\.\. --resume`"
    ):
        check_table_set(tmp_path, "compare")
    with pytest.raises(UserError, match=r"tables\.json: the tables of a compare run, not of a search"):
        check_table_set(tmp_path, "search")
    TableSet(tmp_path, "compare").begin()  # a rewrite starts: the old set is no longer complete
    assert not (tmp_path / MANIFEST).exists()


# --- temporaries ---------------------------------------------------------------------------------------------
WRITER = """
import sys, time
from promptopt.yamlio import atomic_write_bytes_via

def writer(tmp):
    with open(tmp, "w") as handle:
        handle.write("half a table")
    print("writing", flush=True)
    time.sleep(120)

atomic_write_bytes_via(sys.argv[1], writer)
"""


def test_a_killed_writers_temporary_is_removed_and_a_live_writers_is_kept(tmp_path):
    from promptopt.yamlio import atomic_write_bytes_via, remove_orphaned_temporaries

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "compare.parquet")], stdout=subprocess.PIPE, env=env, text=True
    )
    assert killed.stdout.readline() == "writing\n"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (orphan,) = tmp_path.glob("compare.parquet.*.tmp")
    assert orphan.read_text() == "half a table"
    (tmp_path / "notes.tmp").write_text("not a temporary of ours")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "runs.csv.abcd1234.tmp").write_text("")

    started, go_on, removed = threading.Event(), threading.Event(), []

    def slow(tmp):
        Path(tmp).write_text("a whole table")
        started.set()
        assert go_on.wait(30)

    live = threading.Thread(target=atomic_write_bytes_via, args=(tmp_path / "summary.json", slow))
    live.start()
    assert started.wait(30)
    removed = remove_orphaned_temporaries(tmp_path)
    assert removed == [orphan] and len(list(tmp_path.glob("summary.json.*.tmp"))) == 1  # the live one stays
    go_on.set()
    live.join()
    assert (tmp_path / "summary.json").read_text() == "a whole table" and not list(tmp_path.glob("summary.json.*"))
    assert temporaries(tmp_path) == ["notes.tmp", "sub/runs.csv.abcd1234.tmp"]  # not ours; not in this folder
    assert remove_orphaned_temporaries(tmp_path, recursive=True) == [tmp_path / "sub" / "runs.csv.abcd1234.tmp"]


# --- a search killed while it writes its tables ------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)


@pytest.mark.long
def test_a_search_killed_while_writing_a_table_is_refused_then_resume_completes_it(model, tmp_path):
    """kill -9 with the trials table's temporary made and nothing in it: the empty temporary stays, there is no
    tables.json, export and report each refuse in one line; --resume removes the temporary and writes the set."""
    out = tmp_path / "run"
    search = ["search", *LIMITS, "--model", model, "--trials", "2", "--out", str(out)]
    run = Run(*search, PROMPTOPT_FAULT_SLEEP="search-table-write:120")
    run.wait_for("fault-point search-table-write")
    run.proc.send_signal(signal.SIGKILL)
    run.finish()
    (orphan,) = out.glob("trials.parquet.*.tmp")
    assert orphan.stat().st_size == 0 and not (out / "tables.json").exists()
    refused = (
        f"error: {out}: its tables are not a complete set (no tables.json): the search was interrupted while writing "
        "them, or wrote them before promptopt kept table sets; finish it with `promptopt search ... --resume`"
    )
    (out / "summary.json").write_text("{}")  # even beside a summary (an earlier run's): the set is incomplete
    for command in (["export", out, "--out", tmp_path / "card.yaml"], ["report", out, "--out", tmp_path / "r.html"]):
        refusal = cli(*map(str, command))
        lines = [line for line in refusal.stderr.splitlines() if line.strip()]
        assert refusal.code == 2 and lines == [refused], refusal.stderr
    assert not (tmp_path / "card.yaml").exists() and not (tmp_path / "r.html").exists()
    assert_ok(cli(*search, "--resume"))
    assert temporaries(out) == [] and (out / "tables.json").is_file()
    from promptopt.study.tableset import check_table_set

    names = [f["name"] for f in check_table_set(out, "search")["files"]]
    assert names == [
        "trials.parquet",
        "trials.csv",
        "best_test_items.parquet",
        "best_test_items.csv",
        "best_card.yaml",
        "summary.json",
    ]
    assert_ok(cli("export", str(out), "--out", str(tmp_path / "card.yaml")))
