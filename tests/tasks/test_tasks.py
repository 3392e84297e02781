"""Tasks: YAML validation, every built-in task on real offline data, disjoint seeded carving, file and
hub loaders on local files."""

from __future__ import annotations

import json
from importlib import resources

import pandas as pd
import pytest
import yaml

from promptopt.errors import ConfigError, DataError
from promptopt.tasks import builtin_task_names, load_task, load_task_data, load_task_spec
from promptopt.tasks.data import load_rows, to_item
from promptopt.tasks.spec import parse_task

BUILTINS = builtin_task_names()  # every shipped task is loaded below: a new one cannot be left out
REQUIRED = [
    "sst2",
    "arc_easy",
    "arc_challenge",
    "mmlu",
    "gsm8k",
    "triviaqa",
    "boolq",
    "humaneval",
    "basic_arithmetic",
    "arc_easy_gen",
    "mmlu_gen",
]


def test_builtin_names_are_the_shipped_task_files():
    """The names are the task files the package ships (pyproject's tasks/builtin/*.yaml), each file names
    its own task, and none of the required tasks is missing."""
    folder = resources.files("promptopt") / "tasks" / "builtin"
    shipped = sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))
    assert BUILTINS == shipped
    assert [load_task_spec(name).name for name in shipped] == shipped
    assert set(REQUIRED) <= set(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_task_loads_offline_with_disjoint_seeded_splits(name):
    data = load_task(name)
    ids = {role: [i.id for i in data.split(role)] for role in ("pool", "dev", "test")}
    assert all(ids.values())
    assert (
        not set(ids["pool"]) & set(ids["dev"])
        and not set(ids["pool"]) & set(ids["test"])
        and not set(ids["dev"]) & set(ids["test"])
    )
    again = load_task(name)
    assert again.carving() == data.carving()  # seeded: same carving every time
    item = data.test[0]
    assert item.question and item.target
    if data.spec.answer.has_choices:  # multiple_choice and multiple_choice_gen
        assert 0 <= item.gold < len(item.choices) and item.target == item.choices[item.gold]
    prompt = data.default_prompt()
    assert len(prompt.exemplars) == data.spec.k


def test_real_values_are_mapped():
    gsm = load_task("gsm8k")
    janet = to_item(gsm.spec, *load_rows(gsm.spec, "test")[0])  # the first GSM8K test problem
    assert "Janet" in janet.question and janet.gold == "18" and "<<" not in janet.target
    assert all(i.id.startswith("gsm8k-") for i in gsm.test)
    arith = load_task("basic_arithmetic")
    q = arith.test[0]
    assert q.question.startswith("Calculate") and q.gold.lstrip("-").isdigit()
    he = load_task("humaneval")
    assert (
        he.test[0].gold.startswith(("\n\nMETADATA", "\ndef check", "def check", "\n\ndef check"))
        or "def check" in he.test[0].gold
    )
    assert he.test[0].meta["entry_point"]


def test_mmlu_subsets_are_selectable():
    one = load_task("mmlu", subsets=["abstract_algebra"])
    assert {i.id.split("/")[0] for i in one.test} == {"abstract_algebra"}
    assert len(one.test) == 100
    with pytest.raises(DataError, match="unknown subset 'nope'"):
        load_task("mmlu", subsets=["nope"])


def _write_task(tmp_path, data_file, extra=None, **overrides):
    spec = {
        "name": "local",
        "source": {"files": {"train": str(data_file)}},
        "fields": {"question": "q", "choices": ["no", "yes"], "answer": "a"},
        "splits": {
            "seed": 7,
            "pool": {"from": "train", "size": 2},
            "dev": {"from": "train", "size": 2},
            "test": {"from": "train"},
        },
        "answer": {"type": "multiple_choice"},
    }
    spec.update(overrides)
    if extra:
        extra(spec)
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_local_files(tmp_path, fmt):
    frame = pd.DataFrame({"q": [f"question {i}" for i in range(8)], "a": [i % 2 for i in range(8)]})
    data_file = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        data_file.write_text("\n".join(json.dumps(r) for r in frame.to_dict("records")))
    elif fmt == "csv":
        frame.to_csv(data_file, index=False)
    else:
        frame.to_parquet(data_file)
    data = load_task(str(_write_task(tmp_path, data_file)))
    assert len(data.pool) == 2 and len(data.dev) == 2 and len(data.test) == 4
    assert {i.question for i in data.pool + data.dev + data.test} == set(frame["q"])


def test_hub_path_on_a_local_dataset_folder(tmp_path):
    """The online path (datasets.load_dataset) exercised on a local folder, as a hub repo would be."""
    folder = tmp_path / "my_dataset"
    folder.mkdir()
    (folder / "validation.jsonl").write_text("\n".join(json.dumps({"q": f"x{i}", "a": i % 2}) for i in range(6)))
    path = _write_task(tmp_path, folder / "unused", extra=lambda s: s.update(source={"hub": {"path": str(folder)}}))
    spec = load_task_spec(str(path))
    spec_splits = {r: s.__class__("validation", s.size) for r, s in spec.splits.items()}
    data = load_task_data(spec.__class__(**{**spec.__dict__, "splits": spec_splits}))
    assert len(data.test) == 2


def test_bad_task_yaml_names_file_and_key(tmp_path):
    data_file = tmp_path / "d.jsonl"
    data_file.write_text(json.dumps({"q": "a", "a": 0}))
    with pytest.raises(ConfigError, match=r"task.yaml: answer.type: expected one of"):
        load_task_spec(str(_write_task(tmp_path, data_file, answer={"type": "essay"})))
    with pytest.raises(ConfigError, match=r"splits.dev.size: expected an integer from 1 to 10,000,000, got 0"):
        load_task_spec(str(_write_task(tmp_path, data_file, extra=lambda s: s["splits"]["dev"].update(size=0))))
    with pytest.raises(ConfigError, match=r"unknown key"):
        load_task_spec(str(_write_task(tmp_path, data_file, colour="blue")))
    with pytest.raises(ConfigError, match="unknown task"):
        load_task_spec("no_such_task")
    with pytest.raises(ConfigError, match="unknown placeholder"):
        parse_task(
            {
                **yaml.safe_load(_write_task(tmp_path, data_file).read_text()),
                "prompt": {"template": {"query": "{questoin}"}},
            },
            "t.yaml",
        )


def test_data_problems_are_reported(tmp_path):
    data_file = tmp_path / "d.jsonl"
    data_file.write_text("\n".join(json.dumps({"q": "a", "a": 0}) for _ in range(6)))
    with pytest.raises(DataError, match=r"splits.test: needs 5 items from 'train' but only 2 remain of 6"):
        load_task(str(_write_task(tmp_path, data_file, extra=lambda s: s["splits"]["test"].update(size=5))))
    with pytest.raises(DataError, match="data file not found"):
        load_task(str(_write_task(tmp_path, tmp_path / "missing.jsonl")))
    data_file.write_text("\n".join(json.dumps({"q": "a", "b": 0}) for _ in range(5)))
    with pytest.raises(DataError, match=r"d.jsonl line \d+: fields.answer: column 'a' not found"):
        load_task(str(_write_task(tmp_path, data_file)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="is empty"):
        load_task(str(_write_task(tmp_path, empty)))
