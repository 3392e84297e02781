"""Reliability of whole workflows: a compare killed at any phase resumes to the uninterrupted run's tables,
a finished compare rerun scores nothing, and what refuses a resume refuses it before any work.

Runs use the tiny random model with tiny limits; kills go through the PROMPTOPT_FAULT_SLEEP hook (see
tests/test_faults.py and promptopt/search/recovery.py `fault_point`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import optuna
import pandas as pd
import pytest
from tests.clirun import promptopt
from tests.test_faults import assert_ok, assert_one_error_line, assert_run_dir_parses, cli, kill_at, snapshot

COMPARE = ["compare", "--task", "sst2", "--trials", "2", "--dev-limit", "8", "--test-limit", "6", "--robust-limit", "3",
           "--suite", "quick", "--top-n", "1", "--device", "cpu"]
TABLES = ("compare.csv", "compare_paired.csv", "compare_runs.csv")
WALL = ("wall_seconds", "wall_seconds_sd")


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
            frame.loc[i, "selected_by"] = re.sub(r"#(\d+)", lambda m: f"#ordinal{mapping[int(m[1])]}", str(row["selected_by"]))
        return frame

    frames = {name: pd.read_csv(out / name) for name in TABLES}
    frames = {name: as_ordinals(frame) if "selected_by" in frame else frame for name, frame in frames.items()}
    return {name: frame.drop(columns=[c for c in drop if c in frame.columns]) for name, frame in frames.items()}


def assert_same_tables(a: Path, b: Path, drop=WALL) -> None:
    for name, frame in tables(a, drop).items():
        pd.testing.assert_frame_equal(tables(b, drop)[name], frame, check_exact=True, obj=name)


def test_compare_killed_at_every_phase_resumes_to_the_uninterrupted_tables(whole, model, tmp_path):
    """One compare directory killed in turn during a prompt's robustness, before a study, during a study's
    first trial and before a winner's test scoring, each time resumed with --resume: it ends with the tables
    of the compare that was never interrupted."""
    out = tmp_path / "run"
    compare = [*COMPARE, "--model", model, "--out", str(out)]
    kill_at(compare, "compare-robust", nth=2)  # the baseline stressed, the first study's winner half-way
    assert (out / "study.db").exists() and not (out / "compare.csv").exists()
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


def test_finished_compare_rerun_reuses_everything_and_scores_nothing(whole, model, tmp_path):
    """--resume on a finished compare: every study and evaluation reused, no result-cache miss, no
    evaluation file rewritten, the same tables. Without --resume: one line, before any scoring."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    stored = snapshot(out / "evaluations")
    fresh = promptopt(*COMPARE, "--model", model, "--out", out, env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"})
    assert_one_error_line(fresh, "has already started (study 'sst2-ppl' exists", "pass --resume")
    rerun = promptopt(*COMPARE, "--model", model, "--out", out, "--resume", env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"})
    assert rerun.code == 0, rerun.stderr
    assert "fault-point compare-test" not in rerun.stderr  # no prompt scored on the test items
    summary = json.loads((out / "summary.json").read_text())
    assert summary["result_cache_misses"] == 0 and summary["result_cache_hits"] > 0
    assert summary["evaluations_resumed"] == summary["evaluations"] > 0
    assert len(summary["studies_resumed"]) == 3
    assert "0 misses" in rerun.stdout
    assert snapshot(out / "evaluations") == stored
    assert_same_tables(whole, out)


def test_compare_resume_refuses_a_changed_study_before_any_work(whole, model, tmp_path):
    """A resume whose studies would mean something else is refused in one line before the baseline is
    scored or stressed; a study that is missing is created (and the finished ones reused)."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    before = snapshot(out)
    changed = promptopt(*[a if a != "8" else "6" for a in COMPARE], "--model", model, "--out", out, "--resume",
                        env={"PROMPTOPT_FAULT_SLEEP": "compare-test:0"})
    assert_one_error_line(changed, "--resume: study 'sst2-ppl' was created with dev_limit=8 but this run has dev_limit=6")
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
    for command in (["score", "--limit", "2"], ["evaluate", "--suite", "quick", "--limit", "2"]):
        run = promptopt(*command, "--task", "sst2", "--model", model, "--device", "cpu", "--prompt", card)
        assert_one_error_line(run, f"card {card}: item ", "tokens but model")
