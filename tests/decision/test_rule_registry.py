"""Decision rules are a Registry like strategies and answer types (promptopt/decision.py): a rule registered
in-process or installed by a package of its own is fit by the scorer, stored in the card, listed by `--help`,
searched with `strategy@rule`, and decided by `load_prompt` exactly as the scorer decided."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import yaml

from promptopt.decision import DECISION_RULES, RuleKind, batch_bias, normalized, parse_rule, rule_from_card
from promptopt.errors import ConfigError
from promptopt.scoring import Scorer
from promptopt.scoring.calibration import DecidingScorer, fit_rule
from promptopt.tasks import load_task
from tests.clirun import REPO
from tests.test_api import _fake_distribution

# A rule of one's own: batch calibration at half strength (fit on unlabeled dev items), plain Python throughout.
PLUGIN = """
from promptopt.decision import RuleKind, batch_bias


def fit(rows, golds):
    return [0.5 * b for b in batch_bias(rows)], None


def score(n, bias, scale):
    return [v - b for v, b in zip(n, bias)]


HALF = RuleKind("half_batch", "dev", score=score, fit=fit, summary="batch calibration at half strength")
"""


def _half_fit(rows, golds):
    return [0.5 * b for b in batch_bias(rows)], None


def _minus(n, bias, scale):
    return [v - b for v, b in zip(n, bias)]


@pytest.fixture
def half_batch():
    DECISION_RULES.register(RuleKind("half_batch", "dev", score=_minus, fit=_half_fit))
    yield
    DECISION_RULES.unregister("half_batch")


def test_a_registered_rule_is_fit_stored_and_decided_as_by_hand(half_batch, tiny_lm):
    task = load_task("sst2")
    scorer, prompt = Scorer(tiny_lm, task), task.default_prompt()
    rule = fit_rule(parse_rule("half_batch"), scorer, prompt, task.dev[:12])
    rows = [list(r) for r in scorer.score(prompt, task.dev[:12]).table["choice_logprobs"]]
    assert rule.calibrated and not rule.per_item and rule.labels == ("negative", "positive")
    assert list(rule.bias) == pytest.approx([0.5 * b for b in batch_bias(rows)], abs=1e-15)
    assert rule.fitted_on["n"] == 12 and rule.scale is None
    assert rule_from_card(rule.to_card()) == rule  # the card holds what it needs

    test_rows = [list(r) for r in scorer.score(prompt, task.test[:10]).table["choice_logprobs"]]
    by_hand = [max(range(2), key=lambda k: normalized(r)[k] - rule.bias[k]) for r in test_rows]
    decided = DecidingScorer(scorer, rule).score(prompt, task.test[:10]).table
    assert [int(p) for p in decided["pred"]] == by_hand == rule.decide(test_rows)
    assert all(math.isfinite(t) for t in decided["tcb"])  # δ_TCB read on the shifted distribution


def test_a_rule_is_checked_when_registered_and_unknown_names_are_one_line():
    with pytest.raises(ConfigError, match="fit_on 'dev' needs fit"):
        RuleKind("no_fit", "dev", score=_minus)
    with pytest.raises(ConfigError, match="a calibrated rule needs score"):
        RuleKind("no_score", "dev_labels", fit=_half_fit)
    with pytest.raises(
        ConfigError, match=r"unknown decision rule 'batchy' \(did you mean 'batch'\?\).*batch, batch-ada"
    ):
        parse_rule("batchy")
    with pytest.raises(ConfigError, match=r"'batch-adaptiv:acc' \(did you mean 'batch-adaptive'\?\)"):
        parse_rule("batch-adaptiv:acc")
    with pytest.raises(ConfigError, match=r"unknown decision rule 'zzz': use one of"):  # nothing near: no guess
        parse_rule("zzz")
    with pytest.raises(ConfigError, match=r"decision: unknown decision rule 'half_batch'"):
        rule_from_card({"rule": "half_batch", "bias": [0.0, 0.0]})


@pytest.mark.slow
@pytest.mark.long
def test_an_installed_rule_is_listed_searched_and_decided_by_load_prompt(tiny_llama_dir, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _fake_distribution(site, "promptopt.decision_rules", "half_batch", "my_rules:HALF", "my_rules", PLUGIN)
    env = {**os.environ, "PYTHONPATH": f"{site}:{REPO}", "TOKENIZERS_PARALLELISM": "false"}

    def promptopt(*args, **kw):
        return subprocess.run(
            [sys.executable, "-m", "promptopt", *map(str, args)], capture_output=True, text=True, **kw
        )

    shown = promptopt("search", "--help", env=env, check=True).stdout
    assert "half_batch" in " ".join(shown.replace("│", " ").split())  # rich may wrap the list
    out = tmp_path / "run"
    ran = promptopt(
        "search", "--task", "sst2", "--strategy", "accuracy", "--decision", "half_batch", "--trials", "2", "--dev-limit", "12",
        "--test-limit", "6", "--minibatch", "4", "--model", tiny_llama_dir, "--out", out, "--quiet", env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    card_path = tmp_path / "card.yaml"
    exported = promptopt("export", out, "--out", card_path, env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    card = yaml.safe_load(card_path.read_text())
    assert card["decision"]["rule"] == "half_batch" and len(card["decision"]["bias"]) == 2
    assert card["decision"]["package"] == "promptopt-plugin-demo"  # which distribution the rule came from

    # production code decides with the installed rule, torch-free, as the card's bias says
    code = (
        "import sys, promptopt; c = promptopt.load_prompt(sys.argv[1]); "
        "print(c.decide([-0.6, -0.8]), 'torch' in sys.modules)"
    )
    printed = subprocess.run(
        [sys.executable, "-c", code, card_path], capture_output=True, text=True, env=env, check=True
    )
    b = card["decision"]["bias"]
    n = normalized([-0.6, -0.8])
    assert printed.stdout.split() == [str(int(n[1] - b[1] > n[0] - b[0])), "False"]
    # without the package the card names the rule it cannot find and the package to install, in one line (it said
    # "unknown decision rule 'half_batch' (did you mean 'batch'?)", no word of where the rule came from)
    gone = subprocess.run([sys.executable, "-c", code, card_path], capture_output=True, text=True, cwd=tmp_path)
    said = (
        "decision.rule: decision rule 'half_batch' is not installed here: the card was exported with it from package "
    )
    assert gone.returncode != 0 and said + "'promptopt-plugin-demo' (pip install promptopt-plugin-demo)" in gone.stderr
    verified = promptopt("verify", card_path, cwd=tmp_path)
    lines = [line for line in verified.stderr.splitlines() if line.startswith("error:")]
    assert verified.returncode == 2 and len(lines) == 1 and "pip install promptopt-plugin-demo" in lines[0], (
        verified.stderr
    )
