"""The CLI end to end, in subprocesses: real runs print tables; user mistakes print one line and exit 2."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import typer

from tests.clirun import REPO, assert_one_line_error
from tests.clirun import promptopt as run


def test_score_on_tiny_model_writes_table_and_summary(tiny_llama_dir, tmp_path):
    out = tmp_path / "scores.parquet"
    proc = run("score", "--task", "sst2", "--model", str(tiny_llama_dir), "--limit", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "summary" in proc.stdout and "accuracy" in proc.stdout
    table = pd.read_parquet(out)
    assert len(table) == 4 and {"tcb", "v_eff", "margin", "target_nll", "ppl"} <= set(table.columns)
    assert json.loads(out.with_suffix(".json").read_text())["n"] == 4
    assert not list(tmp_path.glob("*.tmp"))
    assert "sst2 · test" in proc.stdout and "item_id" in proc.stdout  # the item table, under its title
    quiet = run("score", "--task", "sst2", "--model", str(tiny_llama_dir), "--limit", "4", "--rows", "0")
    assert quiet.returncode == 0, quiet.stderr
    # --rows 0: the summary alone (it printed an empty item table: its title and header, no rows)
    assert "summary" in quiet.stdout and "item_id" not in quiet.stdout and "sst2 · test" not in quiet.stdout


def test_score_with_a_card(tiny_llama_dir, tiny_lm, tmp_path):
    """The written table is the card's prompt scored, not the task's default prompt (exit 0 alone would
    also pass if --prompt were ignored)."""
    import dataclasses

    import numpy as np

    from promptopt.prompts import save_card
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    task = load_task("sst2")
    default = task.default_prompt()
    template = dataclasses.replace(default.template, label_words=("bad", "good"))  # other answer tokens: other scores
    prompt = default.with_(instruction="Is the review good or bad?", template=template)
    card, out = tmp_path / "card.yaml", tmp_path / "card.csv"
    save_card(prompt, card)
    proc = run(
        "score",
        "--task",
        "sst2",
        "--prompt",
        str(card),
        "--model",
        str(tiny_llama_dir),
        "--limit",
        "2",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    written = pd.read_csv(out)
    scorer, items = Scorer(tiny_lm, task), task.test[:2]
    assert written["item_id"].tolist() == [i.id for i in items]
    np.testing.assert_allclose(written["gold_logprob"], scorer.score(prompt, items).table["gold_logprob"], rtol=1e-4)
    assert not np.allclose(written["gold_logprob"], scorer.score(default, items).table["gold_logprob"], rtol=1e-2)


@pytest.mark.slow
def test_trace_on_embedded_model():
    proc = run("trace", "Count: 1, 2, 3, 4,", "--max-new-tokens", "8", "--plain")
    assert proc.returncode == 0, proc.stderr
    assert "tcb" in proc.stdout and "dip(s) in 8 tokens" in proc.stdout


def test_user_mistakes(tmp_path, tiny_llama_dir):
    assert_one_line_error(run("score", "--task", "nope"), "unknown task 'nope'")
    assert_one_line_error(run("score", "--task", "sst2", "--model", str(tmp_path / "x.gguf")), "model file not found")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nsource: [1\n")
    assert_one_line_error(run("score", "--task", str(bad)), "bad.yaml: invalid YAML")
    card = tmp_path / "card.yaml"
    card.write_text("promptopt_card: 1\ntask: sst2\ntemplate: {chat: maybe}\n")
    assert_one_line_error(
        run("score", "--task", "sst2", "--prompt", str(card), "--model", str(tiny_llama_dir)),
        "template.chat: expected true/false",
    )
    assert_one_line_error(run("score", "--task", "sst2", "--split", "train"), "unknown split 'train'")
    assert_one_line_error(run("score", "--task", "sst2", "--out", str(tmp_path / "x.txt")), "use a .parquet or .csv")
    assert_one_line_error(
        run("score", "--task", "sst2", "--prompt", str(tmp_path / "none.yaml")), "none.yaml: file not found"
    )
    usage = run("score", "--task", "sst2", "--limit", "0")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def help_panels(text: str) -> list[tuple[str, list[str]]]:
    """The panels of a rich `--help` in the order it prints them, each with its commands' names in order."""
    panels: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if title := re.match(r"^╭─ (.+?) ─", line):
            panels.append((title.group(1), []))
        elif (name := re.match(r"^│ ([a-z][\w-]*)\s{2,}", line)) and panels:
            panels[-1][1].append(name.group(1))
    return [(title, names) for title, names in panels if title != "Options"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--help",),
            [
                ("Search and compare", ["search", "compare", "propose", "pair"]),
                ("Evaluate and stress", ["score", "evaluate", "stress"]),
                ("Ship: export, verify, serve", ["export", "verify", "serve"]),
                ("Analyse", ["diagnose", "report", "trace"]),
                ("Other", ["tasks", "model-folder", "check-lmeval"]),
            ],
        ),
        (
            ("diagnose", "--help"),
            [
                ("Of your runs", ["proxy", "risk-coverage"]),
                ("Of a model: the papers' analyses", ["regimes", "geometry", "approx", "conflicts", "taboo"]),
            ],
        ),
    ],
)
def test_help_groups_the_commands_by_what_a_user_does(args, expected):
    """`promptopt --help` shows its panels in this order, each command in its panel in this order (a command added
    later may join a panel; one with no panel would open a "Commands" panel first and fail); every command is shown."""
    from promptopt.cli.app import app

    proc = run(*args, env={"COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    panels = help_panels(proc.stdout)
    assert [title for title, _ in panels] == [title for title, _ in expected], proc.stdout
    for (_, shown), (title, names) in zip(panels, expected, strict=True):
        assert [n for n in shown if n in names] == names, (title, shown)
    group = typer.main.get_command(app)
    for name in args[:-1]:
        group = group.commands[name]
    assert sorted(n for _, shown in panels for n in shown) == sorted(group.commands)


def test_diagnose_help_points_to_its_docs_page():
    text = " ".join(run("diagnose", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "docs/diagnose.md" in text and "README" not in text
    assert (REPO / "docs" / "diagnose.md").exists()


def test_help_lists_every_registered_name_including_one_registered_in_this_process():
    """`compare --help` lists every strategy and `evaluate --help` every perturbation operator, read from the
    registries when help is shown: a plugin's entry, registered here, appears beside the built-in ones."""
    from promptopt.robustness.perturb import OPERATORS
    from promptopt.study.strategies import STRATEGIES, Strategy, accuracy_values

    class PluginOperator:
        name = "zz_plugin_operator"

    plugin = Strategy(name="zz_plugin_strategy", description="a plugin's strategy", item_values=accuracy_values)
    STRATEGIES.register(plugin)
    OPERATORS.register(PluginOperator)
    try:
        compare = " ".join(run("compare", "--help", env={"COLUMNS": "400"}).stdout.split())
        evaluate = " ".join(run("evaluate", "--help", env={"COLUMNS": "400"}).stdout.split())
        strategies, operators = STRATEGIES.names(), OPERATORS.names()
    finally:
        STRATEGIES.unregister("zz_plugin_strategy")
        OPERATORS.unregister("zz_plugin_operator")
    assert "zz_plugin_strategy" in strategies and "zz_plugin_operator" in operators
    assert f"strategies of {', '.join(strategies)}," in compare
    assert f"perturbation operators: {', '.join(operators)} " in evaluate
    assert "built-in suite (cheap, default, quick, unseen)" in evaluate
