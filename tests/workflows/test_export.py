"""Export to production: card v2 (schema, fingerprints, intervals), verify (passes on a fresh card, fails
with a clear diff on an edited one or another model), the light `load_prompt` (no torch; byte-identical
rendering; the judge's own parsing), the derived formats, and one `error:` line for each bad input.

Plumbing runs on a tiny random model; what is about the embedded model (rendering every built-in task's
prompt with its real tokenizer and chat template, the end-to-end example) runs on SmolLM2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from promptopt.study import SearchConfig
from tests.clirun import assert_one_line_error
from tests.clirun import promptopt as run_cli

REPO = Path(__file__).resolve().parents[2]

# A chat template with exemplars: the searched card exercises the light chat renderer and exemplar edits.
SPACE = """\
task: sst2
instructions: {careful: "Be careful: read each review closely before answering."}
exemplars: {candidates: 6, k: [2, 2], search_order: true}
templates:
  chat: {query: "Review: {question}\\nIs the sentiment negative or positive? Answer with one word.", chat: true}
"""


def run_example(*args, process: bool = False):
    """The example as a user runs it: a script, with this checkout's promptopt first on the path (in this
    process unless `process`: tests/clirun.py `script`)."""
    if not process:
        from tests.clirun import script

        return script("examples/production_load_prompt.py", *args)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "production_load_prompt.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


def edit_card(source: Path, target: Path, change) -> Path:
    data = yaml.safe_load(source.read_text())
    change(data)
    target.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000))
    return target


@pytest.fixture(scope="module")
def tiny_run(tiny_llama_dir, tmp_path_factory):
    from promptopt.study import SearchConfig, run_search

    root = tmp_path_factory.mktemp("export-run")
    (root / "space.yaml").write_text(SPACE)
    config = SearchConfig.build(
        task="sst2",
        strategy="tcb",
        trials=3,
        model=str(tiny_llama_dir),
        out=str(root / "run"),
        space=str(root / "space.yaml"),
        dev_limit=8,
        test_limit=6,
        minibatch=4,
        device="cpu",
        incumbent="none",  # export of a searched trial (of a kept incumbent: tests/study/test_incumbent.py)
        scan="off",
    )
    run_search(config, show_progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def tiny_card(tiny_run, tmp_path_factory) -> Path:
    from promptopt.workflows.export import export_run

    out = tmp_path_factory.mktemp("export-card") / "card.yaml"
    export_run(tiny_run, out=out)
    return out


@pytest.fixture(scope="module")
def plain_card(tiny_llama_dir, tmp_path_factory) -> Path:
    """The task's default prompt (plain template, 4 shots) as a card, built without a search."""
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(
        model=ModelConfig(spec=str(tiny_llama_dir), device="cpu"),
        data=DataConfig(task="sst2", dev_limit=4, test_limit=5),
    )
    card = build_card(
        session, session.data.default_prompt(), dev_items=session.items("dev"), test_items=session.items("test")
    )
    path = tmp_path_factory.mktemp("plain-card") / "plain.yaml"
    path.write_text(card_yaml(card))
    return path


# --- the card -------------------------------------------------------------------------------------------
def test_exported_card_records_what_the_score_depends_on(tiny_run, tiny_card, tiny_llama_dir):
    from promptopt.card import validate_card
    from promptopt.prompts import load_card

    card = yaml.safe_load(tiny_card.read_text())
    validate_card(card, str(tiny_card))  # the shipped schema
    summary = json.loads((tiny_run / "summary.json").read_text())
    assert card["promptopt_card"] == 2 and card["task"] == "sst2" and len(card["exemplars"]) == 2
    assert (
        card["rendering"]["mode"] == "chat"
        and card["rendering"]["chat_template"]
        and card["rendering"]["template_vars"]["eos_token"]
    )
    assert card["model"]["spec"] == str(tiny_llama_dir) and card["model"]["weights_method"] == "folder-files"
    assert card["search"] == {
        **card["search"],
        "strategy": "tcb",
        "study": "sst2-tcb",
        "trial": summary["best_trial"],
        "winner": True,
    }
    assert card["data"]["test_ids"] == json.loads((tiny_run / "splits.json").read_text())["test"][:6]
    test = card["metrics"]["test"]
    assert test["accuracy"] == pytest.approx(summary["test"]["accuracy"]) and len(test["correct"]) == 6
    assert test["accuracy_ci95"][0] <= test["accuracy"] <= test["accuracy_ci95"][1]
    assert test["tcb_mean_ci95"][0] <= test["tcb_mean"] <= test["tcb_mean_ci95"][1]
    assert card["versions"]["torch"] and card["versions"]["transformers"] and card["check"]["n_tokens"] > 10
    # card v1 readers still get a prompt and a v1-shaped provenance; the winner is the search's best card
    prompt, provenance = load_card(tiny_card)
    best, _ = load_card(tiny_run / "best_card.yaml")
    assert prompt == best and provenance["model"] == str(tiny_llama_dir) and provenance["test"]["n"] == 6


def test_named_trial_and_other_formats(tiny_run, tmp_path):
    from promptopt.production import card_prompt, load_prompt
    from promptopt.workflows.export import export_run

    exported = export_run(tiny_run, out=tmp_path / "t0.yaml", trial=0)
    assert exported.card["search"]["trial"] == 0 and load_prompt(tmp_path / "t0.yaml").task == "sst2"
    card = card_prompt(export_run(tiny_run, out=tmp_path / "m.json", fmt="messages").card)
    data = json.loads((tmp_path / "m.json").read_text())
    question = "a {braced} and warm film"
    filled = [dict(m, content=m["content"].replace("{question}", question)) for m in data["messages"]]
    assert filled == card.messages(question) and data["answer"]["choices"] == ["negative", "positive"]
    export_run(tiny_run, out=tmp_path / "t.txt", fmt="text")
    assert (tmp_path / "t.txt").read_text().replace("{question}", question) == card.render(question)


@pytest.mark.parametrize("which", ["plain", "chat"])
def test_lm_eval_task_renders_the_same_prompt(which, plain_card, tiny_card, tmp_path):
    """lm-eval renders doc_to_text with Jinja (StrictUndefined, keep_trailing_newline) over each JSONL row:
    the context and the scored continuations must be the card's own."""
    import jinja2

    from promptopt.production import load_prompt
    from promptopt.tasks import load_task
    from promptopt.workflows.formats import write

    source = plain_card if which == "plain" else tiny_card
    card = yaml.safe_load(source.read_text())
    task = load_task("sst2")
    paths = write(card, "lm-eval", tmp_path / "task.yaml", items=task.test)
    assert [p.name for p in paths] == ["task.jsonl", "task.yaml"]
    spec = yaml.safe_load((tmp_path / "task.yaml").read_text())
    rows = [json.loads(line) for line in (tmp_path / "task.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == card["data"]["test_ids"]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    light = load_prompt(source)
    for row in rows:
        assert env.from_string(spec["doc_to_text"]).render(**row) == light.render(row["question"], row["choices"])
        choices = spec["doc_to_choice"] if isinstance(spec["doc_to_choice"], list) else row[spec["doc_to_choice"]]
        assert [spec["target_delimiter"] + c for c in choices] == light.continuations(row["choices"])
        assert row[spec["doc_to_target"]] in (0, 1)
    assert spec["output_type"] == "multiple_choice" and spec["num_fewshot"] == 0


@pytest.mark.parametrize("chat", [False, True])
def test_slots_for_lettered_options_leave_the_exemplars_alone(chat, tiny_lm):
    """mmlu_gen's query lists {options}: the text, messages and lm-eval forms put slots in the final query
    only; filled in, each is the card's own rendering (plain and through the chat template)."""
    from dataclasses import replace

    import jinja2

    from promptopt.production import card_prompt
    from promptopt.prompts import LETTERS
    from promptopt.tasks import load_task
    from promptopt.workflows.export import answer_section, rendering_section
    from promptopt.workflows.formats import lm_eval_doc_to_text, messages_json, text_template

    task = load_task("mmlu_gen")
    prompt = task.default_prompt()
    prompt = prompt.with_(template=replace(prompt.template, chat=chat))
    card = {
        **prompt.to_card(),
        "rendering": rendering_section(prompt, tiny_lm.tokenizer),
        "answer": answer_section(task.spec, task.test[:3]),
        "model": {"spec": "m"},
        "metrics": {"test": {"accuracy": 0.5}},
        "generation": None,
    }
    light = card_prompt(card)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    for item in task.test[:3]:
        options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(item.choices))
        expected = light.render(item.question, item.choices)
        assert text_template(card).replace("{options}", options).replace("{question}", item.question) == expected
        assert (
            env.from_string(lm_eval_doc_to_text(card)).render(question=item.question, choices=list(item.choices))
            == expected
        )
        messages = [
            dict(m, content=m["content"].replace("{options}", options).replace("{question}", item.question))
            for m in messages_json(card)["messages"]
        ]
        assert messages == light.messages(item.question, item.choices)


# --- verify ---------------------------------------------------------------------------------------------
def test_verify_passes_on_a_fresh_card(tiny_card):
    proc = run_cli("verify", tiny_card)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verified" in proc.stdout and "FAIL" not in proc.stdout and "no item flipped" in proc.stdout


def verify_lines(card: Path, **kwargs) -> tuple[bool, str]:
    from promptopt.workflows.verify import verify_card

    result = verify_card(card, device="cpu", **kwargs)
    return result.ok, "\n".join(result.lines())


def test_verify_fails_when_exemplar_text_changes(tiny_card, tmp_path):
    def change(card):
        card["exemplars"][0]["question"] = card["exemplars"][0]["question"] + " Truly."

    ok, out = verify_lines(edit_card(tiny_card, tmp_path / "ex.yaml", change))
    assert not ok, out
    assert "FAIL  prompt fields: exemplars[0] edited after export" in out
    assert "FAIL  rendered text" in out and "FAIL  token ids" in out and "verify failed" in out


def test_verify_fails_when_the_template_changes(plain_card, tmp_path):
    def change(card):
        card["template"]["query"] = card["template"]["query"].replace("Review:", "Movie review:")

    ok, out = verify_lines(edit_card(plain_card, tmp_path / "tpl.yaml", change), limit=3)
    assert not ok, out
    assert "FAIL  prompt fields: template edited after export" in out and "FAIL  token ids" in out
    assert "ok    model weights" in out


@pytest.fixture(scope="module")
def other_model(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny model with one weight changed: same config and tokenizer, different weights."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("other-model") / "tiny-b"
    shutil.copytree(tiny_llama_dir, folder)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("lm_head.weight"))
    weights[name] = weights[name] * 1.5
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_verify_names_a_model_that_differs(tiny_card, other_model, tmp_path, tiny_llama_dir):
    def change(card):
        card["model"]["spec"] = str(other_model)

    ok, out = verify_lines(edit_card(tiny_card, tmp_path / "model.yaml", change), limit=2)
    assert not ok and "FAIL  model weights: folder-files recorded" in out and "ok    tokenizer" in out, out
    proc = run_cli("verify", tiny_card, "--model", other_model, "--limit", "2")  # the CLI: named, exit 1
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAIL  model weights ({other_model} instead of {tiny_llama_dir})" in proc.stdout


def test_verify_without_the_recorded_model_is_one_error(tiny_card, tmp_path):
    missing = tmp_path / "gone"

    def change(card):
        card["model"]["spec"] = str(missing)

    proc = run_cli("verify", edit_card(tiny_card, tmp_path / "gone.yaml", change))
    assert_one_line_error(proc, "gone.yaml: model.spec", f"'{missing}'", "not available on this machine")
    from promptopt.errors import UserError
    from promptopt.workflows.verify import verify_card

    with pytest.raises(UserError, match=r"--model: the given model '.*nope.gguf' is not available"):
        verify_card(tiny_card, model=str(tmp_path / "nope.gguf"))


# --- bad input -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, fragments",
    [
        (
            lambda c: c["metrics"]["test"].update(accuracy="high"),
            ["metrics.test.accuracy: expected number or null, got 'high'"],
        ),
        (lambda c: c["model"].update(weights_sha256="abc"), ["model.weights_sha256: expected a value matching"]),
        (lambda c: c["rendering"].update(mode="html"), ["rendering.mode: expected one of 'plain', 'chat', got 'html'"]),
        (lambda c: c["template"].update(quer="{question}"), ["template.quer: unknown key"]),
        (lambda c: c.pop("check"), ["check: missing"]),
        (
            lambda c: c["metrics"]["test"].update(correct="01"),
            ["metrics.test.correct: expected one character per data.test_ids entry"],
        ),
    ],
)
def test_a_hand_broken_card_is_one_error_naming_file_and_field(tiny_card, tmp_path, change, fragments):
    from promptopt.errors import ConfigError
    from promptopt.production import load_prompt
    from promptopt.prompts import load_card

    path = edit_card(tiny_card, tmp_path / "broken.yaml", change)
    for reader in (load_prompt, load_card):
        with pytest.raises(ConfigError) as info:
            reader(path)
        for fragment in fragments:
            assert fragment in str(info.value) and str(path) in str(info.value)


def test_verify_and_score_on_a_broken_card_print_one_error(tiny_card, tmp_path):
    path = edit_card(tiny_card, tmp_path / "broken.yaml", lambda c: c["metrics"]["test"].update(accuracy="high"))
    assert_one_line_error(
        run_cli("verify", path), str(path), "metrics.test.accuracy: expected number or null, got 'high'"
    )
    assert_one_line_error(
        run_cli("score", "--task", "sst2", "--prompt", path, "--model", "nope/none"), str(path), "metrics.test.accuracy"
    )


def test_export_bad_input_is_one_error_and_writes_nothing(tiny_run, tmp_path):
    out = tmp_path / "card.yaml"
    assert_one_line_error(
        run_cli("export", tiny_run, "--trial", "99", "--out", out), "--trial 99", "no such trial", "trials 0–"
    )
    unfinished = tmp_path / "unfinished"
    shutil.copytree(tiny_run, unfinished)
    (unfinished / "summary.json").unlink()
    assert_one_line_error(run_cli("export", unfinished, "--out", out), "no finished study", "summary.json")
    from promptopt.errors import UserError
    from promptopt.workflows.export import export_run

    for kwargs, message in (
        ({"run_dir": tmp_path}, "not a run directory"),
        ({"run_dir": tiny_run, "fmt": "pdf"}, "--format pdf"),
        ({"run_dir": tiny_run, "strategy": "ppl"}, "--strategy ppl: .* is a tcb run"),
    ):
        with pytest.raises(UserError, match=message):
            export_run(out=out, **kwargs)
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_export_reads_the_study_that_moved_with_the_run_and_leaves_it_as_it_was(tiny_run, tmp_path):
    """A copied run directory reads its own study.db (the original may be gone, e.g. on a machine it was copied
    to); reading leaves no -wal / -shm beside it; a missing study.db is one error naming the copy's file, and is not
    created; so is a study.db without the run's study."""
    import sqlite3

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # its settings still name tiny_run, where its study.db was written

    def files():  # SQLite's -wal / -shm come and go with whoever in this process holds a file open
        return sorted(p.name for p in run.iterdir() if not p.name.endswith(("-wal", "-shm")))

    before = files()
    first = run_cli("export", run, "--out", tmp_path / "card.yaml")
    assert first.code == 0, first.stderr
    assert files() == before and "study.db" in before
    assert not (run / "study.db-wal").exists() and not (run / "study.db-shm").exists()  # the study was closed

    (run / "study.db").unlink()  # tiny_run's study.db is still there: the copy must not read it
    assert_one_line_error(
        run_cli("export", run, "--out", tmp_path / "again.yaml"), f"{run.resolve() / 'study.db'} is missing"
    )
    assert not (run / "study.db").exists() and not (tmp_path / "again.yaml").exists()

    sqlite3.connect(run / "study.db").close()  # an SQLite file that holds no study
    assert_one_line_error(run_cli("export", run, "--out", tmp_path / "again.yaml"), str(run), "no study 'sst2-tcb'")


@pytest.mark.long
def test_export_from_a_compare_directory_never_reads_the_test_set(tiny_llama_dir, tmp_path):
    """The pick reads dev numbers only: whatever the test columns say (shuffled across the candidates), the same
    card is chosen, and the card says by which rule. Named trials and robust picks after the fact too."""
    from promptopt.workflows.compare import run_compare
    from promptopt.workflows.export import compare_candidates, export_run, open_run
    from promptopt.workflows.export.select import select_by_dev
    from tests.study.test_table_sets import reseal

    config = SearchConfig.build(
        task="sst2",
        trials=2,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "cmp"),
        dev_limit=6,
        test_limit=4,
        minibatch=3,
        device="cpu",
    )
    run_compare(config, ["accuracy", "tcb"], suite=None, top_n=2, show_progress=False)
    root = tmp_path / "cmp"
    exported = export_run(root, out=tmp_path / "card.yaml", strategy="tcb")
    assert exported.card["search"]["strategy"] == "tcb" and exported.card["search"]["study"] == "sst2-tcb"
    assert exported.card["metrics"]["robustness"] is None  # compared without a suite
    assert (
        "dev accuracy" in exported.card["search"]["selection"]
        and "no test number" in exported.card["search"]["selection"]
    )
    rule = exported.card["search"]["selection_rule"]  # which winners tied, and why the tie-break chose
    assert rule["tie_break"] == "argmax" and rule["n_dev_items"] == 6 and rule["tie_set"]
    from promptopt.workflows.session import Session

    session = Session(model=config.model, data=config.data)
    default = session.scorer.score(session.data.default_prompt(), session.items("test")).table["correct"].mean()
    warned = any("not better than the task's default prompt" in w for w in exported.warnings)
    assert warned == (exported.card["metrics"]["test"]["accuracy"] <= default)

    runs = pd.read_csv(root / "compare_runs.csv")
    dev_best, _, _ = select_by_dev(compare_candidates(root))  # the selection rule, on dev columns only
    picked = open_run(root)
    assert (picked.config.study.strategy, picked.winner_trial) == (dev_best["strategy"], int(dev_best["trial"]))
    test_columns = [
        c for c in runs.columns if c in ("avg_acc", "acc_ci_low", "acc_ci_high", "avg_tcb", "acc_worst", "pdr")
    ]
    searched = runs.index[runs["strategy"] != "baseline"]
    distinct = np.linspace(0.1, 0.9, len(searched))  # test accuracies that would each make another candidate the best
    for shift in range(len(searched)):  # every rotation of the test numbers over the candidates
        shuffled = runs.copy()
        shuffled.loc[searched, test_columns] = runs.loc[np.roll(searched, shift), test_columns].to_numpy()
        shuffled.loc[searched, "avg_acc"] = np.roll(distinct, shift)
        shuffled.to_csv(root / "compare_runs.csv", index=False)
        reseal(root)  # changed on purpose: sealed again as a complete set
        again = open_run(root)
        assert (again.config.study.strategy, again.winner_trial) == (picked.config.study.strategy, picked.winner_trial)
    runs.to_csv(root / "compare_runs.csv", index=False)
    reseal(root)

    robust = export_run(root, out=tmp_path / "robust.yaml", select="robust")
    assert (
        robust.card["search"]["selection"].startswith("--select robust")
        and "no test number" in robust.card["search"]["selection"]
    )
    assert robust.card["search"]["selection_rule"]["tie_break"] == "robust"
    named = export_run(root, out=tmp_path / "named.yaml", strategy="tcb", trial=0).card
    assert named["search"]["trial"] == 0 and "--trial" in named["search"]["selection"]


# --- load_prompt ------------------------------------------------------------------------------------------
def test_load_prompt_imports_neither_torch_nor_transformers(tiny_card):
    code = f"""
import sys, time
start = time.perf_counter()
import promptopt
card = promptopt.load_prompt({str(tiny_card)!r})
text = card.render("a gorgeous film")
answer = card.parse("Positive, clearly.")
elapsed = time.perf_counter() - start
heavy = [m for m in ("torch", "transformers", "numpy", "pandas") if m in sys.modules]
print(repr(answer), heavy, elapsed)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    assert out[0] == "'positive'" and out[1] == "[]", out


def test_load_prompt_renders_the_searched_card_byte_identically(tiny_card, tiny_lm):
    from promptopt.card import sha256_text
    from promptopt.production import load_prompt
    from promptopt.prompts import load_card
    from promptopt.tasks import load_task

    card = load_prompt(tiny_card)
    prompt, _ = load_card(tiny_card)
    by_id = {i.id: i for i in load_task("sst2").test}
    for item_id in card.card["data"]["test_ids"]:
        item = by_id[item_id]
        assert card.render(item.question, item.choices) == prompt.context(
            item.question, item.choices, tiny_lm.tokenizer
        )
    first = by_id[card.card["check"]["item_id"]]
    assert sha256_text(card.render(first.question, first.choices)) == card.card["check"]["text_sha256"]


@pytest.mark.slow
def test_load_prompt_renders_every_builtin_default_prompt_as_the_scorer_does(embedded_lm):
    """For every built-in task's default prompt, plain and through SmolLM2's chat template: the light
    renderer's text equals `Prompt.context` with the real tokenizer (what the scorer scores)."""
    from dataclasses import replace

    from promptopt.production import card_prompt
    from promptopt.tasks import builtin_task_names, load_task
    from promptopt.workflows.export import answer_section, rendering_section

    tokenizer = embedded_lm.tokenizer
    for name in builtin_task_names():
        task = load_task(name)
        default = task.default_prompt()
        for prompt in (default, default.with_(template=replace(default.template, chat=True))):
            card = {
                **prompt.to_card(),
                "rendering": rendering_section(prompt, tokenizer),
                "answer": answer_section(task.spec, task.test[:3]),
            }
            light = card_prompt(card, name)
            for item in task.test[:3]:
                expected = prompt.context(item.question, item.choices, tokenizer)
                assert light.render(item.question, item.choices) == expected, (name, prompt.template.chat)
                assert light.messages(item.question, item.choices) == prompt.messages(item.question, item.choices)


@pytest.mark.parametrize(
    "task_name, outputs",
    [
        ("sst2", ["positive", " Negative.", "The answer is B", "hmm"]),
        ("mmlu_gen", ["B", "(C) because", "The answer is D.", "nothing here", "A. the first"]),
        ("gsm8k", ["so 3 + 4 = 7\n#### 7", "The answer is $1,200.", "no number"]),
        ("triviaqa", ["Paris\nmore text", "  the Beatles  ", ""]),
    ],
)
def test_parse_reads_answers_as_the_judge_does(task_name, outputs):
    """parse() is the task's answer extraction: for generative tasks it agrees with the answer type's judge."""
    from promptopt.production import card_prompt
    from promptopt.tasks import load_task
    from promptopt.workflows.export import answer_section

    task = load_task(task_name)
    prompt = task.default_prompt()
    card = card_prompt({**prompt.to_card(), "answer": answer_section(task.spec, task.test[:5])})
    item = task.test[0]
    for text in outputs:
        parsed = card.parse(text, item.choices)
        if task.spec.generative:
            extracted, _, correct = task.spec.answer.judge(task.spec, item, text, prompt)
            if item.choices is not None:
                shown = prompt.choice_texts(item.choices)
                assert card.parse_index(text, item.choices) == (shown.index(extracted) if extracted else None)
            else:
                assert (parsed or "") == extracted
        elif text.strip().lower().startswith(("positive", "negative")):
            assert parsed == text.strip().lower().rstrip(".")


def test_continuations_without_choices_needs_the_items_choices():
    """A task whose items each have their own choices once got [] from continuations() (an argmax over
    nothing); now it is one error saying what to pass. Fixed choices (SST-2) stay the default."""
    from promptopt.errors import ConfigError
    from promptopt.production import card_prompt
    from promptopt.tasks import load_task
    from promptopt.workflows.export import answer_section

    arc = load_task("arc_easy")
    card = card_prompt(
        {**arc.default_prompt().to_card(), "answer": answer_section(arc.spec, arc.test[:5])}, "card.yaml"
    )
    with pytest.raises(ConfigError, match=r"^card\.yaml: task arc_easy has no fixed choices .*pass the item's choices"):
        card.continuations()
    item = arc.test[0]
    assert card.continuations(item.choices) == [" " + c for c in item.choices]
    sst2 = load_task("sst2")
    fixed = card_prompt({**sst2.default_prompt().to_card(), "answer": answer_section(sst2.spec, sst2.test[:5])})
    assert fixed.continuations() == [" negative", " positive"]


# --- the embedded model, end to end -----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.long
def test_export_verify_and_plain_transformers_on_the_embedded_model(tmp_path):
    """From a search on SmolLM2: export → verify passes → the example scores the card with plain
    transformers via load_prompt and gets the card's accuracy on the same items."""
    from promptopt.study import SearchConfig, run_search

    config = SearchConfig.build(
        task="sst2", trials=2, out=str(tmp_path / "run"), dev_limit=4, test_limit=4, minibatch=4, device="cpu"
    )
    run_search(config, show_progress=False)
    proc = run_cli("export", tmp_path / "run", "--out", tmp_path / "card.yaml")
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("verify", tmp_path / "card.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    example = run_example(tmp_path / "card.yaml")
    assert example.returncode == 0, example.stdout + example.stderr
    assert "on 4 recorded test items" in example.stdout


@pytest.mark.slow
@pytest.mark.long
def test_example_runs_a_generative_card(tmp_path):
    """A number task (basic_arithmetic, 8 new tokens): greedy transformers decoding + card.parse agrees with
    promptopt's judge on every item."""
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.export import build_card
    from promptopt.workflows.formats import card_yaml
    from promptopt.workflows.session import Session

    session = Session(model=ModelConfig(device="cpu"), data=DataConfig(task="basic_arithmetic", test_limit=3))
    card = build_card(session, session.data.default_prompt(), dev_items=[], test_items=session.items("test"))
    (tmp_path / "arith.yaml").write_text(card_yaml(card))
    example = run_example(tmp_path / "arith.yaml", process=True)  # one real process: the script as a user starts it
    assert example.returncode == 0, example.stdout + example.stderr


# --- the default-prompt warning, on every export path -------------------------------------------------------------
NOT_BETTER = "not better than the task's default prompt"


@pytest.fixture(scope="module")
def tiny_compare(tiny_llama_dir, tmp_path_factory) -> Path:
    from promptopt.workflows.compare import run_compare

    root = tmp_path_factory.mktemp("export-paths") / "cmp"
    config = SearchConfig.build(
        task="sst2", trials=3, model=str(tiny_llama_dir), out=str(root), dev_limit=6, test_limit=6, device="cpu"
    )
    run_compare(config, ["accuracy", "tcb"], suite=None, top_n=2, show_progress=False)
    return root


EXPORT_PATHS = {
    "winner": {},
    "strategy": {"strategy": "tcb"},
    "trial": {"strategy": "tcb", "trial": 0},
    "robust": {"select": "robust"},
    "ensemble": {"ensemble": 2},
    "ensemble-text": {"ensemble": 2, "fmt": "text"},
    "messages": {"fmt": "messages"},
}


@pytest.mark.parametrize("path", list(EXPORT_PATHS))
def test_every_export_path_warns_when_the_default_prompt_is_as_good(path, tiny_compare, tmp_path, monkeypatch):
    """Every way `export` can write a card measures the task's default prompt on the card's test items and warns
    when the card is not better: as measured (the warning iff the card's accuracy ≤ the default's), and with a
    default prompt that answers every test item right (a card can never beat it: the warning must be there)."""
    from promptopt.workflows.export import export_run, workflow

    suffix = ".txt" if EXPORT_PATHS[path].get("fmt") == "text" else ".yaml"
    exported = export_run(tiny_compare, out=tmp_path / f"card{suffix}", **EXPORT_PATHS[path])
    assert exported.default is not None and exported.default["n"] == exported.card["metrics"]["test"]["n"]
    warned = any(NOT_BETTER in w for w in exported.warnings)
    assert warned == (exported.card["metrics"]["test"]["accuracy"] <= exported.default["accuracy"]), exported.warnings

    measured = workflow.default_answers

    def perfect(session):
        default = measured(session)
        return {**default, "accuracy": 1.0, "correct": [True] * default["n"]}

    monkeypatch.setattr(workflow, "default_answers", perfect)
    exported = export_run(tiny_compare, out=tmp_path / f"again{suffix}", **EXPORT_PATHS[path])
    assert any(NOT_BETTER in w for w in exported.warnings), (path, exported.warnings)
    if "ensemble" in EXPORT_PATHS[path] and EXPORT_PATHS[path].get("fmt") == "text":
        assert any("first of the ensemble's 2 prompts" in w for w in exported.warnings), exported.warnings


SWAPPED_SPACE = """task: sst2
description: "prompts whose label words are swapped, so a negative review reads positive: worse than the default"
instructions: {none: "", read: "Read the review."}
exemplars: {candidates: 4, k: [0, 0]}
templates:
  swapped: {query: "Review: {question}\\nSentiment:", label_words: [positive, negative]}
"""


@pytest.mark.slow
@pytest.mark.long
def test_an_ensemble_worse_than_the_default_prompt_is_warned_on_the_embedded_model(tmp_path):
    """`export --ensemble 2` of a search whose every prompt swaps SST-2's label words (a real model reads the
    words, so every member and the ensemble are worse than the task's default prompt): the warning on stderr."""
    from promptopt.study import run_search

    (tmp_path / "space.yaml").write_text(SWAPPED_SPACE)
    config = SearchConfig.build(model="smollm2-135m-instruct", out=str(tmp_path / "run"), device="cpu", task="sst2",
                                strategy="accuracy", trials=2, dev_limit=6, test_limit=16, pruning=False,
                                space=str(tmp_path / "space.yaml"))  # fmt: skip
    run_search(config, show_progress=False)
    result = run_cli("export", tmp_path / "run", "--ensemble", "2", "--out", tmp_path / "ens.yaml")
    assert result.code == 0, result.stderr
    card = yaml.safe_load((tmp_path / "ens.yaml").read_text())
    assert len(card["ensemble"]["members"]) == 2
    assert "warning: the exported prompt is not better than the task's default prompt on the same 16 test items" in (
        result.stderr
    ), result.stderr
