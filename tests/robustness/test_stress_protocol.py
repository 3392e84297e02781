"""The Taboo paper's protocol preset (answer lines, stops, seeded subsample) and the resumable models × tasks
sweep (Figures 1, 3, 8)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from promptopt.errors import ConfigError, UserError
from promptopt.models.runner import cut_at_stop
from promptopt.robustness.protocol import load_protocol
from promptopt.tasks import DataConfig
from promptopt.tasks.extract import answer_line
from tests.clirun import assert_one_line_error, promptopt


# --- extraction ------------------------------------------------------------------------------------
def test_answer_line_is_the_first_explicit_answer():
    text = "12 + 30 = 42, minus 5 is 37.\nAnswer: 37\n\nQuestion: a made-up follow-up\nAnswer: 99"
    line, start = answer_line(text)
    assert (line, text[start : start + 2]) == ("37", "37")
    assert answer_line("**Final answer:** $1,200 per month") == ("$1,200 per month", 18)
    assert answer_line("no stated answer, the result is 5") is None
    assert answer_line("Answer:\n") is None  # an empty answer line states nothing


@pytest.fixture(scope="module")
def paper():
    return load_protocol("taboo-paper")


def _applied(protocol, task, limit=None):
    return protocol.apply(DataConfig(task=task), limit=limit)


def test_gsm8k_reads_the_answer_line_else_the_last_number(paper):
    data, prompt, items = _applied(paper, "gsm8k")
    spec, item = data.spec, items[0]
    gold = item.gold
    wrong = str(int(gold) + 1)
    read = lambda text: spec.answer.read(spec, item, text, prompt)  # noqa: E731
    assert read(f"First {wrong} apples, then {wrong} more.\nAnswer: {gold} apples in {wrong} days")[
        2
    ]  # the line's first number
    assert not read(f"So {gold} is wrong.\nAnswer: {wrong}")[2]  # the answer line wins over earlier numbers
    assert read(f"We get {wrong}, then {gold}")[2]  # no answer line: the last number
    assert read(f"Answer: let me check the units first.\nAnswer: {gold}")[
        2
    ]  # the first answer line that states a number
    assert read(f"Steps.\nAnswer:\n{gold}\n")[2]  # an empty answer line states the next line
    assert read(f"Answer: {wrong} - 1 = {gold}")[2]  # after the last '=': the final number of the line
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
    # no answer line (a derailed chain of thought): only "the answer is X" counts, never a leading capital
    assert read("A square is a rectangle, B is wrong") == ("", -1, False)
    assert read("Thinking it over, the answer is (B).")[2]


def test_triviaqa_stops_do_not_cut_washington_dc(paper):
    data, prompt, items = _applied(paper, "triviaqa")
    generated = " The US capital is named after George Washington.\nAnswer: Washington, D.C.\nQuestion: What is next?"
    text, stopped = cut_at_stop(generated, data.spec.stop)
    assert stopped and text.endswith("Answer: Washington, D.C.")
    original = DataConfig(task="triviaqa").load().spec
    assert (
        cut_at_stop(generated, original.stop)[0] == " The US capital is named after George Washington"
    )  # the task's own stops cut at "."
    item = items[0].__class__(
        "q", "What is the capital of the USA?", ("Washington, D.C.", "Washington DC"), "Washington, D.C."
    )
    assert data.spec.answer.read(data.spec, item, text, prompt)[2]


@pytest.mark.long
def test_protocol_is_the_papers_setting(paper):
    for task in ("gsm8k", "mmlu_gen", "triviaqa"):
        data, prompt, items = _applied(paper, task)
        assert len(prompt.exemplars) == 2 and all("\nAnswer: " in prompt.exemplar_answer(e) for e in prompt.exemplars)
        assert data.spec.max_new_tokens == 512 and data.spec.extract == "answer_line"
        assert len(items) == 500  # GSM8K too: the protocol's test split is all the task's pool and dev leave
        again = _applied(paper, task)[2]
        assert [i.id for i in again] == [i.id for i in items]  # a fixed seeded subsample
        assert [i.id for i in _applied(paper, task, limit=5)[2]] == [i.id for i in items[:5]]
        carved = DataConfig(task=task).load()
        assert not {i.id for i in items} & {i.id for i in carved.pool + carved.dev}  # never a search's pool or dev item
    from dataclasses import replace

    data, _, sample = _applied(replace(paper, n=50), "triviaqa")
    test_ids, ids = [i.id for i in data.test], [i.id for i in sample]
    assert len(ids) == 50 and ids != test_ids[:50] and set(ids) <= set(test_ids)  # a seeded sample, not the first n
    assert ids == [i for i in test_ids if i in set(ids)]  # in the split's order
    assert paper.ranks == (1, 2, 4, 8)


def test_protocol_refuses_what_it_cannot_run(paper, tmp_path):
    from dataclasses import replace

    with pytest.raises(UserError, match="no prompt for task mmlu .*mmlu_gen"):
        _applied(paper, "mmlu")
    with pytest.raises(UserError, match="no prompt for task basic_arithmetic"):
        _applied(paper, "basic_arithmetic")
    with pytest.raises(UserError, match="humaneval is run, not read from an answer line"):
        _applied(replace(paper, prompts={**paper.prompts, "humaneval": paper.prompts["gsm8k"]}), "humaneval")
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
    from promptopt.tasks.catalog import load_task_spec

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"q{i}", "a": ["x"], "c": ["x", "y"], "g": 0}) + "\n" for i in range(4)))
    task = tmp_path / "t.yaml"
    task.write_text(
        "name: t\nsource: {files: {test: rows.jsonl}}\nfields: {question: q, choices: c, answer: g}\n"
        "splits: {test: {from: test}}\nanswer: {type: multiple_choice, extract: answer_line}\n"
    )
    with pytest.raises(ConfigError, match="t.yaml: answer.extract: expected 'default' .*log-likelihood"):
        load_task_spec(str(task))
    task.write_text(
        "name: t\nsource: {files: {test: rows.jsonl}}\nfields: {question: q, answer: a}\n"
        "splits: {pool: {from: test, size: 1}, dev: {from: test, size: 1}, test: {from: test}}\n"
        "answer: {type: alias_match, extract: answer_line}\n"
    )
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
    return promptopt(
        "stress",
        "--models",
        f"{tiny_dir},{second}",
        "--tasks",
        "triviaqa,gsm8k",
        "--protocol",
        protocol,
        "--out",
        out,
        "--device",
        "cpu",
        *extra,
    )


@pytest.mark.long
def test_sweep_writes_figures_and_resumes_without_decoding_again(
    tmp_path, tiny_llama_dir, monkeypatch, models_loaded_fresh
):
    import gc
    import weakref

    import promptopt.models.load as load

    out = tmp_path / "sweep"
    loaded = []
    real_load = load.ModelConfig.load

    def tracked_load(self):
        gc.collect()
        assert all(ref() is None for ref in loaded), "the previous model is still alive while the next one loads"
        lm = real_load(self)
        loaded.append(weakref.ref(lm.model))
        return lm

    monkeypatch.setattr(load.ModelConfig, "load", tracked_load)
    first = _sweep(tmp_path, tiny_llama_dir, out)
    assert first.code == 0, first.stderr
    assert len(loaded) == 2
    monkeypatch.undo()
    assert "12 condition(s) decoded, 0 reused" in first.stdout
    summary = pd.read_parquet(out / "sweep_summary.parquet")
    assert len(summary) == 2 * 2 * 3 and set(summary["rank"]) == {0, 1, 2}
    assert {"retention", "retention_ci_low", "retention_ci_high", "accuracy", "length_expansion"} <= set(
        summary.columns
    )
    assert (summary["n"] == 3).all()
    for name in (
        "figure1_retention.png",
        "figure3_accuracy.png",
        "figure8_length.png",
        "sweep_summary.csv",
        "sweep.json",
    ):
        assert (out / name).stat().st_size > 0
    # the two models' cells are kept apart although their folders share the name
    assert len(list((out / "cells").iterdir())) == 2

    import promptopt.models.load as load

    def no_load(self):
        raise AssertionError("a finished sweep must not load a model")

    monkeypatch.setattr(load.ModelConfig, "load", no_load)
    again = _sweep(tmp_path, tiny_llama_dir, out)
    assert again.code == 0, again.stderr
    assert "0 condition(s) decoded, 12 reused" in again.stdout
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep_summary.parquet"), summary)
    monkeypatch.undo()

    # a crash lost one condition: only that one is decoded again, and the numbers are the same
    cell = next((out / "cells").iterdir()) / "gsm8k"
    (cell / "rank_2.parquet").unlink()
    resumed = _sweep(tmp_path, tiny_llama_dir, out)
    assert "1 condition(s) decoded, 11 reused" in resumed.stdout, resumed.stderr
    pd.testing.assert_frame_equal(pd.read_parquet(out / "sweep_summary.parquet"), summary)

    # a cell computed with another prompt (or task file, items, weights) is refused, never mixed in
    identity = json.loads((cell / "cell.json").read_text())
    (cell / "cell.json").write_text(json.dumps({**identity, "prompt_sha256": "0" * 64}))
    refused = _sweep(tmp_path, tiny_llama_dir, out)
    assert_one_line_error(refused, "computed with another prompt")
    (cell / "cell.json").write_text(json.dumps(identity))
    one = pd.read_parquet(cell / "rank_1.parquet")
    one.iloc[::-1].to_parquet(
        cell / "rank_1.parquet"
    )  # a condition whose rows are other items (order) than the baseline's
    mixed = _sweep(tmp_path, tiny_llama_dir, out)
    assert_one_line_error(mixed, "rank_1.parquet: its items differ")


def test_sweep_refuses_other_settings_on_the_same_folder(tmp_path, tiny_llama_dir):

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"protocol": "x", "ranks": [1]}))
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text(PROTOCOL)
    args = [
        "stress",
        "--models",
        str(tiny_llama_dir),
        "--tasks",
        "triviaqa",
        "--protocol",
        str(protocol),
        "--device",
        "cpu",
    ]
    assert_one_line_error(promptopt(*args, "--out", str(out)), f"{out}: holds a sweep with protocol = 'x'")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    settings = {
        "protocol": "tiny",
        "protocol_sha256": __import__("hashlib").sha256(protocol.read_bytes()).hexdigest(),
        "ranks": [1, 2],
        "mode": "word_initial",
        "temperature": 0.0,
        "seed": 0,
        "split": "test",
        "limit": None,
        "dtype": "bfloat16",
        "device_type": "cpu",
        "quantize": None,
        "batch_size": 16,
        "subsets": None,
    }
    (fresh / "sweep.json").write_text(json.dumps(settings))  # a sweep run in bf16: a float32 run does not join it
    assert_one_line_error(
        promptopt(*args, "--out", str(fresh)), "holds a sweep with dtype = 'bfloat16', this run has 'float32'"
    )
    assert_one_line_error(promptopt(*args), "needs --out FOLDER")
    assert_one_line_error(
        promptopt("stress", "--tasks", "mmlu", "--out", str(tmp_path / "o2")),
        "mmlu is scored by log-likelihood",
        "mmlu_gen",
    )
    assert_one_line_error(
        promptopt(*args, "--models", f"{tiny_llama_dir},{tiny_llama_dir}", "--out", str(tmp_path / "o3")),
        "is given twice",
    )
    assert_one_line_error(
        promptopt(*args, "--models", ",", "--out", str(tmp_path / "o4")), "--models: expected a comma-separated list"
    )
    assert_one_line_error(
        promptopt(*args, "--split", "dev", "--out", str(tmp_path / "o5")), "--split: protocol tiny draws its items"
    )
    assert not any((tmp_path / f"o{i}").exists() for i in range(2, 6))  # refused before anything was written
