"""The Taboo paper's protocol preset (answer lines, stops, seeded subsample) and the resumable models × tasks
sweep (Figures 1, 3, 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from promptopt.cli import app
from promptopt.errors import ConfigError, UserError
from promptopt.models.runner import cut_at_stop
from promptopt.robustness.protocol import load_protocol
from promptopt.tasks import DataConfig
from promptopt.tasks.extract import answer_line


# --- extraction ------------------------------------------------------------------------------------
def test_answer_line_is_the_first_explicit_answer():
    text = "12 + 30 = 42, minus 5 is 37.\nAnswer: 37\n\nQuestion: a made-up follow-up\nAnswer: 99"
    line, start = answer_line(text)
    assert (line, text[start:start + 2]) == ("37", "37")
    assert answer_line("**Final answer:** $1,200 per month") == ("$1,200 per month", 18)
    assert answer_line("no stated answer, the result is 5") is None
    assert answer_line("Answer:\n") is None  # an empty answer line states nothing


@pytest.fixture(scope="module")
def paper():
    return load_protocol("taboo-paper")


def _applied(protocol, task):
    return protocol.apply(DataConfig(task=task).load())


def test_gsm8k_reads_the_answer_line_else_the_last_number(paper):
    data, prompt, items = _applied(paper, "gsm8k")
    spec, item = data.spec, items[0]
    gold = item.gold
    wrong = str(int(gold) + 1)
    read = lambda text: spec.answer.read(spec, item, text, prompt)  # noqa: E731
    assert read(f"First {wrong} apples, then {wrong} more.\nAnswer: {gold} apples in {wrong} days")[2]  # the line's first number
    assert not read(f"So {gold} is wrong.\nAnswer: {wrong}")[2]  # the answer line wins over earlier numbers
    assert read(f"We get {wrong}, then {gold}")[2]  # no answer line: the last number
    answer, start, _ = read(f"Steps.\nAnswer: {gold}")
    assert f"Steps.\nAnswer: {gold}"[start:].startswith(gold)  # where the answer starts, for the critical point


def test_mmlu_gen_reads_the_letter_of_the_first_answer_line(paper):
    data, prompt, items = _applied(paper, "mmlu_gen")
    spec = data.spec
    item = next(i for i in items if i.gold == 1)
    read = lambda text: spec.answer.read(spec, item, text, prompt)  # noqa: E731
    assert read("Option A is a distractor; B follows.\nAnswer: B\n\nQuestion: next\nAnswer: A")[:3:2] == ("B", True)
    assert read("Answer: (B)")[2]
    assert not read("B looks tempting.\nAnswer: C")[2]


def test_triviaqa_stops_do_not_cut_washington_dc(paper):
    data, prompt, items = _applied(paper, "triviaqa")
    generated = " The US capital is named after George Washington.\nAnswer: Washington, D.C.\nQuestion: What is next?"
    text, stopped = cut_at_stop(generated, data.spec.stop)
    assert stopped and text.endswith("Answer: Washington, D.C.")
    original = DataConfig(task="triviaqa").load().spec
    assert cut_at_stop(generated, original.stop)[0] == " The US capital is named after George Washington"  # the task's own stops cut at "."
    item = items[0].__class__("q", "What is the capital of the USA?", ("Washington, D.C.", "Washington DC"), "Washington, D.C.")
    assert data.spec.answer.read(data.spec, item, text, prompt)[2]


def test_protocol_is_the_papers_setting(paper):
    for task in ("gsm8k", "mmlu_gen", "triviaqa"):
        data, prompt, items = _applied(paper, task)
        assert len(prompt.exemplars) == 2 and all("\nAnswer: " in prompt.exemplar_answer(e) for e in prompt.exemplars)
        assert data.spec.max_new_tokens == 512 and data.spec.extract == "answer_line"
        assert len(items) == min(500, len(DataConfig(task=task).load().test))
        again = _applied(paper, task)[2]
        assert [i.id for i in again] == [i.id for i in items]  # a fixed seeded subsample
        assert [i.id for i in paper.apply(DataConfig(task=task).load(), limit=5)[2]] == [i.id for i in items[:5]]
    from dataclasses import replace

    test_ids = [i.id for i in DataConfig(task="triviaqa").load().test]
    ids = [i.id for i in _applied(replace(paper, n=50), "triviaqa")[2]]
    assert len(ids) == 50 and ids != test_ids[:50] and set(ids) <= set(test_ids)  # a seeded sample, not the first n
    assert ids == [i for i in test_ids if i in set(ids)]  # in the split's order
    assert paper.ranks == (1, 2, 4, 8)


def test_protocol_refuses_what_it_cannot_run(paper, tmp_path):
    with pytest.raises(UserError, match="no prompt for task mmlu .*mmlu_gen"):
        _applied(paper, "mmlu")
    with pytest.raises(UserError, match="no prompt for task basic_arithmetic"):
        _applied(paper, "basic_arithmetic")
    bad = tmp_path / "p.yaml"
    bad.write_text("max_new_tokens: 0\ntasks: {gsm8k: {}}\n")
    with pytest.raises(ConfigError, match=r"p.yaml: max_new_tokens: expected a positive integer, got 0"):
        load_protocol(str(bad))
    bad.write_text("max_new_tokens: 8\nextract: last_line\ntasks: {gsm8k: {}}\n")
    with pytest.raises(ConfigError, match=r"extract: expected one of default, answer_line"):
        load_protocol(str(bad))
    with pytest.raises(ConfigError, match="unknown protocol 'nope'.*taboo-paper"):
        load_protocol("nope")


def test_answer_extract_in_a_task_file_is_checked(tmp_path):
    from promptopt.tasks.spec import load_task_spec

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"q{i}", "a": ["x"], "c": ["x", "y"], "g": 0}) + "\n" for i in range(4)))
    task = tmp_path / "t.yaml"
    task.write_text("name: t\nsource: {files: {test: rows.jsonl}}\nfields: {question: q, choices: c, answer: g}\n"
                    "splits: {test: {from: test}}\nanswer: {type: multiple_choice, extract: answer_line}\n")
    with pytest.raises(ConfigError, match="t.yaml: answer.extract: expected 'default' .*log-likelihood"):
        load_task_spec(str(task))
    task.write_text("name: t\nsource: {files: {test: rows.jsonl}}\nfields: {question: q, answer: a}\n"
                    "splits: {pool: {from: test, size: 1}, dev: {from: test, size: 1}, test: {from: test}}\n"
                    "answer: {type: alias_match, extract: answer_line}\n")
    assert load_task_spec(str(task)).extract == "answer_line"


# --- the sweep -------------------------------------------------------------------------------------
PROTOCOL = """name: tiny
n: 3
seed: 3
ranks: [1, 2]
max_new_tokens: 5
stop: ["\\nQuestion:"]
tasks:
  triviaqa:
    template: {query: "Question: {question}\\nReasoning:"}
    exemplars: [{question: "Which planet is red?", answer: "It is Mars.\\nAnswer: Mars"}]
  gsm8k:
    template: {query: "Question: {question}\\nReasoning:"}
    exemplars: [{question: "What is 2 + 3?", answer: "2 + 3 = 5.\\nAnswer: 5"}]
"""


def _sweep(tmp_path, tiny_dir, out, *extra):
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(PROTOCOL)
    second = tmp_path / "other" / Path(tiny_dir).name
    if not second.exists():
        shutil.copytree(tiny_dir, second)  # a second "model" (same weights) whose folder has the same name
    return CliRunner().invoke(app, ["stress", "--models", f"{tiny_dir},{second}", "--tasks", "triviaqa,gsm8k",
                                    "--protocol", str(protocol), "--out", str(out), "--device", "cpu", *extra])


def test_sweep_writes_figures_and_resumes_without_decoding_again(tmp_path, tiny_llama_dir, monkeypatch):
    out = tmp_path / "sweep"
    first = _sweep(tmp_path, tiny_llama_dir, out)
    assert first.exit_code == 0, first.output
    assert "12 condition(s) decoded, 0 reused" in first.output
    summary = pd.read_parquet(out / "sweep_summary.parquet")
    assert len(summary) == 2 * 2 * 3 and set(summary["rank"]) == {0, 1, 2}
    assert {"retention", "retention_ci_low", "retention_ci_high", "accuracy", "length_expansion"} <= set(summary.columns)
    assert (summary["n"] == 3).all()
    for name in ("figure1_retention.png", "figure3_accuracy.png", "figure8_length.png", "sweep_summary.csv", "sweep.json"):
        assert (out / name).stat().st_size > 0
    # the two models' cells are kept apart although their folders share the name
    assert len(list((out / "cells").iterdir())) == 2

    import promptopt.models.load as load

    def no_load(self):
        raise AssertionError("a finished sweep must not load a model")

    monkeypatch.setattr(load.ModelConfig, "load", no_load)
    again = _sweep(tmp_path, tiny_llama_dir, out)
    assert again.exit_code == 0, again.output
    assert "0 condition(s) decoded, 12 reused" in again.output
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep_summary.parquet"), summary)
    monkeypatch.undo()

    # a crash lost one condition: only that one is decoded again, and the numbers are the same
    cell = next((out / "cells").iterdir()) / "gsm8k"
    (cell / "rank_2.parquet").unlink()
    resumed = _sweep(tmp_path, tiny_llama_dir, out)
    assert "1 condition(s) decoded, 11 reused" in resumed.output, resumed.output
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep_summary.parquet"), summary)


def test_sweep_refuses_other_settings_on_the_same_folder(tmp_path, tiny_llama_dir):
    from tests.test_cli import assert_one_line_error, run

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"protocol": "x", "ranks": [1]}))
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(PROTOCOL)
    args = ["stress", "--models", str(tiny_llama_dir), "--tasks", "triviaqa", "--protocol", str(protocol), "--device", "cpu"]
    assert_one_line_error(run(*args, "--out", str(out)), f"{out}: holds a sweep with protocol = 'x'")
    assert_one_line_error(run(*args), "needs --out FOLDER")
    assert_one_line_error(run("stress", "--tasks", "mmlu", "--out", str(tmp_path / "o2")), "mmlu is scored by log-likelihood", "mmlu_gen")
    assert_one_line_error(run(*args, "--models", f"{tiny_llama_dir},{tiny_llama_dir}", "--out", str(tmp_path / "o3")), "is given twice")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()  # refused before anything was written
