"""A task file is someone else's input (issue 58): what it may read (its own folder tree, symlinks followed), what an
error may echo (never a foreign file's keys or lines, a data file's header only bounded), how long and how large its
templates may render, and which numbers it may hold, all driven through `promptopt score` on real files; each
refusal is one `error:` line before any model loads (the model named does not exist)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.clirun import promptopt as cli

CANARY = "CANARY7731"
NO_MODEL = "/nonexistent/model.gguf"  # a run that gets past the task says so: "model file not found"


def _score(task: Path, *flags: str):
    run = cli("score", "--task", str(task), "--model", NO_MODEL, *flags)
    return run, (run.stdout + run.stderr)


def _one_error(run, text: str) -> str:
    lines = [line for line in run.stderr.strip().splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), text
    assert "model file not found" not in text and "Traceback" not in text, text
    return lines[0]


def _lm_eval_task(folder: Path, **keys) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text(json.dumps({"q": "x", "a": "y"}) + "\n")
    task = {
        "task": "t",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(folder / "rows.jsonl")}},
        "test_split": "test",
        "doc_to_text": "q",
        "doc_to_target": "a",
        **keys,
    }
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def _task(folder: Path, rows: str = "rows.jsonl", **keys) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps({"q": f"q{i}", "a": i % 2}) + "\n" for i in range(4)))
    task = {
        "name": "t",
        "source": {"files": {"test": rows}},
        "splits": {"test": {"from": "test"}},
        "answer": {"type": "multiple_choice"},
        "doc_to_text": "{{ q }}",
        "doc_to_choice": ["no", "yes"],
        "doc_to_target": "a",
        **keys,
    }
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


# --- what a task file may read, and what an error may echo ---------------------------------------------------------
@pytest.mark.parametrize(
    "include", ["/etc/shadow", "/etc/passwd", "../secret.yaml", "link.yaml", "sub/../../secret.yaml"]
)
def test_an_include_outside_the_task_folder_is_refused_without_a_word_of_the_file(tmp_path, include):
    (tmp_path / "secret.yaml").write_text(f"{CANARY}: not yours\nroot:x:0:0:root:/root:/bin/bash: 1\n")
    path = _lm_eval_task(tmp_path / "task", include=include)
    (tmp_path / "task" / "link.yaml").symlink_to(tmp_path / "secret.yaml")
    run, text = _score(path)
    line = _one_error(run, text)
    assert CANARY not in text and "root:" not in text and "not yours" not in text, text
    assert "include" in line and "outside the task file's folder" in line and "--trust-task-code" in line, line


def test_an_included_file_is_read_with_trust_and_its_unknown_keys_are_counted_never_quoted(tmp_path):
    (tmp_path / "secret.yaml").write_text(f"{CANARY}: not yours\nother_key_4410: 1\n")
    path = _lm_eval_task(tmp_path / "task", include="../secret.yaml")
    run, text = _score(path, "--trust-task-code")
    line = _one_error(run, text)
    assert CANARY not in text and "other_key_4410" not in text and "not yours" not in text, text
    assert "secret.yaml (included by" in line and "2 keys" in line, line


def test_an_include_inside_the_folder_tree_is_read_and_a_typo_in_it_is_named(tmp_path):
    folder = tmp_path / "task"
    (folder / "common").mkdir(parents=True)
    (folder / "common" / "base.yaml").write_text("output_typ: generate_until\n")
    path = _lm_eval_task(folder, include="common/base.yaml")
    run, text = _score(path)
    line = _one_error(run, text)
    assert "base.yaml (included by" in line and "output_typ" in line and "did you mean 'output_type'" in line, line
    (folder / "common" / "base.yaml").write_text("output_type: generate_until\n")
    run, text = _score(path)
    assert "model file not found" in text, text  # read, and the run went on to the model


@pytest.mark.parametrize("kind", ["symlink", "absolute", "dotdot"])
def test_a_data_file_outside_the_task_folder_is_refused_unless_trusted_and_never_echoed(tmp_path, kind):
    outside = tmp_path / "private.csv"
    outside.write_text(f"{CANARY}_password,q,a\nhunter2,x,0\nhunter3,y,1\n")
    folder = tmp_path / "task"
    folder.mkdir()
    rows = {"symlink": "shadow.csv", "absolute": str(outside), "dotdot": "../private.csv"}[kind]
    (folder / "shadow.csv").symlink_to(outside)
    path = _task(folder, rows=rows)
    run, text = _score(path)
    line = _one_error(run, text)
    assert CANARY not in text and "hunter" not in text, text
    assert "source.files.test" in line and "outside the task file's folder" in line, line
    run, text = _score(path, "--trust-task-code")  # trusted: read (and it scores)
    assert "model file not found" in text, text


def test_a_data_file_header_is_quoted_only_in_bounded_form(tmp_path):
    folder = tmp_path / "task"
    folder.mkdir()
    header = [f"{CANARY}_" + "x" * 200] + [f"col{i}" for i in range(40)]
    (folder / "wide.csv").write_text(",".join(header) + "\n" + ",".join("v" for _ in header) + "\n")
    path = _task(folder, rows="wide.csv", doc_to_text="{{ question }}")
    run, text = _score(path)
    line = _one_error(run, text)
    assert "'question', which is not a column" in line and "more)" in line, line
    assert "col39" not in text and "x" * 20 not in text and f"{CANARY}_" + "x" * 12 + "…" in line, text


@pytest.mark.parametrize(
    "dataset_path, files",
    [("text", "/etc/passwd"), ("/etc", None), ("org/name", "/etc/passwd"), ("org/name", "../x.csv")],
)
def test_a_hub_dataset_that_would_read_local_files_is_refused(tmp_path, dataset_path, files):
    path = _lm_eval_task(tmp_path / "task")
    task = yaml.safe_load(path.read_text())
    task["dataset_path"] = dataset_path
    task["dataset_kwargs"] = {"data_files": files} if files else {}
    path.write_text(yaml.safe_dump(task))
    run, text = _score(path)
    line = _one_error(run, text)
    assert "root:" not in text and ("dataset_path" in line or "data_files" in line), line


# --- templates: time and size ----------------------------------------------------------------------------------------
TEMPLATE_CAP_MB = 600  # the whole `promptopt score` process (Python, torch, pandas imported) stays under this


@pytest.mark.parametrize(
    "template, limit",
    [  # each case is a `promptopt score` process (~5 s): the first two (time, size) in every tier, the rest `long`
        ("{% for x in range(100000) %}{% for y in range(100000) %}{% endfor %}{% endfor %}{{ q }}", "ran past 1 s"),
        ("{{ 'a' * 10**9 }}", "1,000,000"),
        pytest.param(
            "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "1,000,000",
            marks=pytest.mark.long,
        ),
        pytest.param("{{ 'a'|center(10**9) }}", "1,000,000", marks=pytest.mark.long),
        pytest.param("{{ '%1000000000d'|format(1) }}", "1,000,000", marks=pytest.mark.long),
        pytest.param("{{ ('a' * 900000).replace('a', 'bbbbbbbbbb') }}", "1,000,000", marks=pytest.mark.long),
        pytest.param("{{ (range(100000)|list) | join('x' * 100000) }}", "1,000,000", marks=pytest.mark.long),
        pytest.param("{{ 2 ** (10**9) }}", "4,096 bits", marks=pytest.mark.long),
        pytest.param("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}", "", marks=pytest.mark.long),
    ],
)
def test_a_template_fails_in_one_line_within_seconds_and_a_bounded_memory(tmp_path, template, limit):
    path = _task(tmp_path / "task", doc_to_text=template)
    rss_file = tmp_path / "rss"
    wrapper = (
        "import atexit, resource, runpy, sys\n"
        # the peak of this process's own memory (VmHWM, reset by exec): getrusage's ru_maxrss keeps the forking
        # pytest worker's peak across fork and exec, 1.7 GB after a worker had loaded a model
        "def peak():\n"
        "    return next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        f"atexit.register(lambda: open({str(rss_file)!r}, 'w').write(peak()))\n"
        f"sys.argv = ['promptopt', 'score', '--task', {str(path)!r}, '--model', {NO_MODEL!r}]\n"
        "runpy.run_module('promptopt', run_name='__main__')\n"
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", wrapper],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30)),
    )
    seconds = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "doc_to_text" in lines[0] and limit in lines[0], proc.stderr
    peak_mb = int(rss_file.read_text()) / 1024
    assert peak_mb < TEMPLATE_CAP_MB, peak_mb
    assert seconds < 60, seconds  # the interpreter and its imports included (a few seconds on an idle machine)


def test_ordinary_templates_still_render(tmp_path):
    from promptopt.tasks import load_task

    template = (
        "{% for w in q.split() %}{{ loop.index }}:{{ w|upper ~ '!' * 2 }} {% endfor %}{{ '%5s|%-3d' % ('a', 7) }}"
    )
    path = _task(tmp_path / "task", doc_to_text=template)
    data = load_task(str(path))
    assert data.test[0].question.endswith("!!     a|7  ")


# --- numbers -------------------------------------------------------------------------------------------------------
def _code_task(folder: Path, timeout: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text(json.dumps({"q": "def f(): pass", "t": "assert True", "e": "f"}) + "\n")
    path = folder / "task.yaml"
    path.write_text(
        "name: t\nsource: {files: {test: rows.jsonl}}\nsplits: {test: {from: test}}\n"
        f"answer: {{type: code, timeout: {timeout}}}\nfields: {{question: q, answer: q, test: t, entry_point: e}}\n"
    )
    return path


@pytest.mark.parametrize("timeout", [".inf", "-.inf", ".nan", "-5", "0", "1.0e+12", "61", "'10'", "true"])
def test_answer_timeout_out_of_bounds_is_one_line_before_the_model_loads(tmp_path, timeout):
    run, text = _score(_code_task(tmp_path, timeout))
    line = _one_error(run, text)
    assert "answer.timeout: expected a number above 0 and at most 60" in line, line


def test_answer_timeout_in_bounds_goes_on_to_the_model(tmp_path):
    run, text = _score(_code_task(tmp_path, "2.5"))
    assert "model file not found" in text, text


@pytest.mark.parametrize(
    "keys, where",
    [
        ({"splits": {"seed": -1, "test": {"from": "test"}}}, "splits.seed"),
        ({"splits": {"test": {"from": "test", "size": 10**12}}}, "splits.test.size"),
        ({"prompt": {"k": 10**9}}, "prompt.k"),
        ({"generation": {"max_new_tokens": 10**12}}, "generation.max_new_tokens"),
    ],
)
def test_every_number_of_a_task_file_is_bounded(tmp_path, keys, where):
    path = _task(tmp_path / "task", **keys)
    if "generation" in keys:
        task = yaml.safe_load(path.read_text())
        task["answer"] = {"type": "exact_match"}
        task.pop("doc_to_choice")
        path.write_text(yaml.safe_dump(task))
    run, text = _score(path)
    assert where in _one_error(run, text)


@pytest.mark.parametrize(
    "keys, where",
    [
        ({"num_fewshot": 10**9}, "num_fewshot"),
        ({"generation_kwargs": {"max_gen_toks": 10**12}}, "max_gen_toks"),
        ({"generation_kwargs": {"temperature": "hot"}}, "temperature"),
        ({"filter_list": [{"name": "x", "filter": [{"function": "regex", "group_select": 10**20}]}]}, "group_select"),
        ({"filter_list": [{"name": "x", "filter": [{"function": "regex", "regex_pattern": "("}]}]}, "regex_pattern"),
    ],
)
def test_every_number_of_an_lm_eval_task_file_is_bounded(tmp_path, keys, where):
    run, text = _score(_lm_eval_task(tmp_path / "task", **keys))
    assert where in _one_error(run, text)
