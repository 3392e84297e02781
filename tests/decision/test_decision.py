"""Decision rules (promptopt/decision.py, scoring/calibration.py): hand-computed values, the refusal for
per-item choices, δ_TCB read on the decided distribution, and production deciding as the scorer does."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from promptopt.decision import (
    DecisionRule,
    batch_bias,
    ensemble_scores,
    normalized,
    parse_rule,
    rule_from_card,
)
from promptopt.errors import ConfigError
from promptopt.scoring import Scorer
from promptopt.scoring.calibration import (
    DecidingScorer,
    cross_fitted_decisions,
    decide_table,
    fit_affine,
    fit_rule,
)
from promptopt.tasks import load_task

ROWS = [[-1.0, -2.0], [-3.0, -1.0], [-0.5, -4.0]]


def test_batch_bias_by_hand():
    # ñ of row 1: [-1 - log(e^-1 + e^-2), -2 - ...]; log(e^-1 + e^-2) = -1 + log(1 + e^-1) = -0.686738...
    lse = [-1 + math.log(1 + math.exp(-1)), -1 + math.log(1 + math.exp(-2)), -0.5 + math.log(1 + math.exp(-3.5))]
    n = [[a - s for a in row] for row, s in zip(ROWS, lse)]
    assert normalized(ROWS[0]) == pytest.approx(n[0], abs=1e-15)
    mean = [sum(col) / 3 for col in zip(*n)]
    centre = sum(mean) / 2
    assert batch_bias(ROWS) == pytest.approx([mean[0] - centre, mean[1] - centre], abs=1e-15)
    assert sum(batch_bias(ROWS)) == pytest.approx(0.0, abs=1e-15)


def test_rules_decide_by_hand():
    rule = DecisionRule(kind="batch", labels=("no", "yes"), bias=(0.8, -0.8))
    # ñ of [-1, -1.2]: the labels differ by 0.2; minus the bias (+0.8 on 'no') the second label wins
    assert rule.decide([[-1.0, -1.2]]) == [1]
    assert DecisionRule().decide([[-1.0, -1.2]]) == [0]
    affine = DecisionRule(kind="affine", labels=("no", "yes"), scale=(2.0, 1.0), bias=(-0.1, 0.1))
    n = normalized([-1.0, -1.2])
    assert affine.scores([-1.0, -1.2]) == pytest.approx([2 * n[0] - 0.1, n[1] + 0.1])
    # the shift δ_TCB reads: s − ñ, centered; for a bias-only rule exactly −b
    assert rule.logit_shift([-1.0, -1.2]) == pytest.approx([-0.8, 0.8])
    assert affine.logit_shift([-1.0, -1.2]) == pytest.approx(
        [(n[0] - 0.1 - (0.1)) / 2, -(n[0] - 0.1 - 0.1) / 2]  # (s − ñ) = [n0 − 0.1, 0.1], centered
    )


def test_adaptive_batch_reads_the_batch_only_when_large_enough():
    stored = (0.0, 0.0)
    rule = DecisionRule(kind="batch", mode="adaptive", labels=("a", "b"), bias=stored, min_batch=3)
    rows = [[-0.1, -2.0], [-0.2, -1.5], [-0.3, -1.0]]  # every input favours 'a': the batch's bias removes that
    assert rule.bias_for(rows) == pytest.approx(batch_bias(rows))
    assert rule.bias_for(rows[:2]) == list(stored)
    assert rule.decide(rows) == [0, 1, 1]  # relative to the batch, the last two lean to 'b'
    assert rule.decide(rows[:2]) == [0, 0]


def test_ensemble_scores_average_normalized_members():
    a, b = [0.0, -10.0], [-3.0, -2.0]  # member a is confident, b mildly the other way
    out = ensemble_scores([a, b])
    assert out == pytest.approx([(normalized(a)[0] + normalized(b)[0]) / 2, (normalized(a)[1] + normalized(b)[1]) / 2])
    assert int(np.argmax(out)) == 0


def test_affine_fit_is_the_penalized_optimum():
    """The fitted (a, b) is a stationary point of the penalized NLL (finite differences), and b is centered."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(40, 3)).tolist()
    golds = rng.integers(0, 3, size=40).tolist()
    a, b = fit_affine(rows, golds)
    assert sum(b) == pytest.approx(0.0, abs=1e-12)
    x, y, lam = np.array([normalized(r) for r in rows]), np.array(golds), 1.0 / 40

    def objective(theta):
        z = x * theta[:3] + theta[3:]
        z = z - z.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        return -logp[np.arange(40), y].mean() + lam * (((theta[:3] - 1) ** 2).sum() + (theta[3:] ** 2).sum())

    # the optimum is defined up to a common constant in b, and centering picks the one with the least penalty
    theta = np.array(a + b)
    for i in range(6):
        step = np.zeros(6)
        step[i] = 1e-5
        assert (objective(theta + step) - objective(theta - step)) / 2e-5 == pytest.approx(0.0, abs=2e-4)


def test_cross_fitting_never_decides_an_item_with_its_own_label():
    """Flip one item's label: a cross-fitted decision of that item cannot change (its fold's fit never saw it)."""
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(25, 2)).tolist()
    golds = rng.integers(0, 2, size=25).tolist()
    rule = DecisionRule(kind="affine", labels=("a", "b"), scale=(1.0, 1.0), bias=(0.0, 0.0))
    base = cross_fitted_decisions(rule, rows, golds)
    flipped = list(golds)
    flipped[7] = 1 - flipped[7]
    assert cross_fitted_decisions(rule, rows, flipped)[7] == base[7]


def test_card_mapping_round_trips_and_errors_name_the_field():
    rule = DecisionRule(kind="affine", reading="acc", labels=("a", "b"), scale=(1.5, 0.5), bias=(0.2, -0.2))
    assert rule_from_card(rule.to_card()) == rule
    with pytest.raises(ConfigError, match=r"card.yaml: decision.bias: rule batch needs its fitted bias"):
        rule_from_card({"rule": "batch"}, "card.yaml: decision")
    with pytest.raises(ConfigError, match=r"decision.scale: rule affine needs one scale per label"):
        rule_from_card({"rule": "affine", "bias": [0.0, 0.0]})
    with pytest.raises(ConfigError, match="unknown decision rule 'batchy'"):
        parse_rule("batchy")
    assert parse_rule("batch-adaptive").mode == "adaptive" and parse_rule("affine:acc_norm").reading == "acc_norm"


def test_calibrated_rules_refuse_per_item_choices_in_one_line(tiny_lm):
    task = load_task("arc_easy")
    scorer = Scorer(tiny_lm, task)
    with pytest.raises(ConfigError) as exc:
        fit_rule(parse_rule("batch"), scorer, task.default_prompt(), task.dev[:4])
    assert "needs the same labels on every item" in str(exc.value) and "arc_easy" in str(exc.value)
    assert "\n" not in str(exc.value)
    # argmax still works there
    assert fit_rule(parse_rule("argmax"), scorer, task.default_prompt(), task.dev[:4]).kind == "argmax"


@pytest.mark.parametrize("name", ["contextual", "batch", "affine"])
def test_deciding_scorer_reads_tcb_on_the_shifted_distribution(tiny_lm, name):
    """δ_TCB of a calibrated decision equals the output head's δ_TCB at the same hidden states with the rule's
    shift on the label tokens, computed independently here."""
    task = load_task("sst2")
    scorer, prompt = Scorer(tiny_lm, task), task.default_prompt()
    rule = fit_rule(parse_rule(name), scorer, prompt, task.dev[:12])
    assert rule.calibrated and len(rule.bias) == 2 and rule.labels == ("negative", "positive")
    raw = scorer.score(prompt, task.test[:8])
    decided = DecidingScorer(scorer, rule).score(prompt, task.test[:8]).table
    assert (decided["tcb_basis"] == "calibrated").all()
    rows = [list(r) for r in raw.table["choice_logprobs"]]
    shift = torch.tensor([rule.logit_shift(r) for r in rows], dtype=torch.float64)
    tokens = torch.tensor([list(t) for t in raw.table["choice_first_tokens"]])
    target = tokens[torch.arange(8), torch.tensor(raw.table["gold"].to_numpy())]
    expect = tiny_lm.output_head(raw.hidden, target=target, shift_tokens=tokens, shift_values=shift)
    assert np.allclose(decided["tcb"], expect.tcb.numpy(), rtol=1e-12)
    assert np.allclose(decided["tcb_raw"], raw.table["tcb"], rtol=1e-12)
    assert list(decided["pred"]) == rule.decide(rows)
    assert list(decided["pred_raw"]) == list(raw.table["pred"])


def test_argmax_decisions_leave_the_table_as_scored(tiny_lm):
    task = load_task("sst2")
    scorer, prompt = Scorer(tiny_lm, task), task.default_prompt()
    raw = scorer.score(prompt, task.test[:6]).table
    decided = decide_table(DecisionRule(), raw)
    assert list(decided["pred"]) == list(raw["pred"]) and list(decided["correct"]) == list(raw["correct"])
    assert (decided["tcb"] == raw["tcb"]).all()
