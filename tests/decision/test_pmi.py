"""The pmi decision rule (domain-conditional PMI) for tasks whose items carry their own choices: hand-computed
values, the card mapping, the scorer's content-free references against an independent scoring, δ_TCB of the
decided distribution against the float64 Jacobian with the per-item shift, and load_prompt deciding as the
scorer does (tiny random model; the embedded model's round trip and lm-eval's acc_mutual_info:
tests/decision/test_pmi_cards.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from promptopt.decision import DecisionRule, parse_rule, reference_row, rule_from_card
from promptopt.errors import ConfigError
from promptopt.metrics import jacobian_frobenius_reference
from promptopt.scoring import Scorer
from promptopt.scoring.calibration import DecidingScorer, first_token_shifts, fit_rule
from promptopt.tasks import load_task


def test_pmi_by_hand():
    rule = parse_rule("pmi")
    assert rule.kind == "pmi" and rule.calibrated and rule.per_item and rule.fitted and rule.content_free == ("",)
    # two content-free inputs: r_k = log mean_j exp(ℓ_jk)
    ref = reference_row([[-1.0, -3.0], [-2.0, -1.0]])
    assert ref == pytest.approx(
        [math.log((math.exp(-1) + math.exp(-2)) / 2), math.log((math.exp(-3) + math.exp(-1)) / 2)]
    )
    rows, refs = [[-2.0, -2.5], [-4.0, -1.0]], [[-1.0, -3.0], [-5.0, -0.5]]
    assert rule.scores(rows[0], refs[0]) == [-1.0, 0.5]
    assert rule.decide(rows, refs) == [1, 0]  # argmax would say [0, 1]
    assert DecisionRule().decide(rows) == [0, 1]
    # the shift δ_TCB reads: −r, centered
    assert rule.logit_shift(rows[0], refs[0]) == pytest.approx([-1.0, 1.0])  # −r = [1, 3]
    with pytest.raises(ConfigError, match="content-free log-likelihood of every choice"):
        rule.scores(rows[0])
    with pytest.raises(ConfigError, match="needs its content-free reference"):
        rule.decide(rows)


def test_pmi_card_mapping_round_trips_and_names_its_field():
    rule = parse_rule("pmi:acc_norm").with_params(content_free=("", "N/A"))
    card = rule.to_card()
    assert card == {"rule": "pmi", "reading": "acc_norm", "content_free": ["", "N/A"]}
    assert rule_from_card(card) == rule
    with pytest.raises(ConfigError, match=r"card.yaml: decision.content_free: rule pmi needs its content-free inputs"):
        rule_from_card({"rule": "pmi"}, "card.yaml: decision")


def test_first_token_shifts_merge_choices_that_share_a_token():
    ids, values = first_token_shifts([5, 7, 5], [-1.0, -2.0, -3.0], [0.5, -0.2, 1.0])
    assert ids == [5, 7] and values[1] == -0.2
    # the factor by which the decision reweights the mass of the choices starting with token 5
    expect = math.log(math.exp(-1 + 0.5) + math.exp(-3 + 1.0)) - math.log(math.exp(-1) + math.exp(-3))
    assert values[0] == pytest.approx(expect)


@pytest.fixture(scope="module")
def arc(tiny_lm):
    task = load_task("arc_easy")
    return task, Scorer(tiny_lm, task), task.default_prompt()


def test_pmi_serves_per_item_choices_and_decides_by_the_content_free_reference(arc, tiny_lm):
    """Before pmi every calibrated rule refused ARC; pmi's decision scores are each choice's log-likelihood minus
    its log-likelihood after the same prompt with an empty question, which is scored here independently."""
    task, scorer, prompt = arc
    items = task.test[:6]
    rule = fit_rule(parse_rule("pmi:acc"), scorer, prompt, task.dev[:4])
    assert rule.kind == "pmi" and rule.labels is None and rule.content_free == ("",)
    decided = DecidingScorer(scorer, rule).score(prompt, items).table
    tok = tiny_lm.tokenizer
    for item, row in zip(items, decided.to_dict("records")):
        ctx = prompt.context("", item.choices, tok)
        pairs = scorer._pairs(
            [ctx] * len(item.choices), [prompt.continuation(c) for c in item.choices], prompt, ["x"] * len(item.choices)
        )
        cf = [r.logprob for r in scorer.runner.loglikelihood(pairs)]
        expect = [a - b for a, b in zip(row["choice_logprobs"], cf)]
        assert row["decision_scores"] == pytest.approx(expect, abs=1e-4)
        assert row["pred"] == int(np.argmax(expect))
    assert (decided["tcb_basis"] == "calibrated").all()
    # the references are kept: a second call scores no content-free pair again
    calls = []
    real = scorer.runner.loglikelihood
    scorer.runner.loglikelihood = lambda *a, **k: calls.append(len(a[0])) or real(*a, **k)
    try:
        DecidingScorer(scorer, rule).score(prompt, items)
    finally:
        scorer.runner.loglikelihood = real
    assert len(calls) == 1  # the items' own choices only


def test_pmi_tcb_matches_the_float64_jacobian_with_the_per_item_shift(arc, tiny_lm):
    """δ_TCB of a pmi decision is that of the read position's distribution shifted by each item's own −r_k at its
    choices' first tokens (merged where choices share one): against the explicit float64 Jacobian, ≤ 1e-6."""
    task, scorer, prompt = arc
    items = task.test[:8]
    rule = fit_rule(parse_rule("pmi:acc"), scorer, prompt, task.dev[:4])
    raw = scorer.score(prompt, items)
    decided = DecidingScorer(scorer, rule).score(prompt, items).table
    head = tiny_lm.output_head
    vocab = head.weight.shape[0]
    dense = torch.zeros(len(items), vocab, dtype=torch.float64)
    for i, row in enumerate(decided.to_dict("records")):
        shift = rule.logit_shift(list(row["choice_logprobs"]), list(row["choice_logprobs_cf"]))
        ids, values = first_token_shifts(list(row["choice_first_tokens"]), list(row["choice_logprobs"]), shift)
        dense[i, ids] = torch.tensor(values, dtype=torch.float64)
    assert dense.abs().sum() > 0
    ref = jacobian_frobenius_reference(raw.hidden, head.weight, bias=head.bias, logit_shift=dense)
    assert np.allclose(decided["jacobian_norm"], ref.numpy(), rtol=1e-6, atol=0)
    assert np.allclose(decided["tcb"], 1.0 / ref.numpy(), rtol=1e-6, atol=0)
    assert not np.allclose(decided["tcb"], raw.table["tcb"], rtol=1e-3)  # the shift matters


def test_load_prompt_decides_pmi_as_the_scorer(arc, tiny_lm):
    """A pmi card's production helper: content_free_requests names what to score, decide_batch decides from those
    log-likelihoods exactly as the scorer did (both readings)."""
    from promptopt.production import card_prompt

    task, scorer, prompt = arc
    items = task.test[:10]
    for reading in ("acc", "acc_norm"):
        rule = fit_rule(parse_rule(f"pmi:{reading}"), scorer, prompt, task.dev[:4])
        decided = DecidingScorer(scorer, rule).score(prompt, items).table
        card = card_prompt({**prompt.to_card(), "decision": rule.to_card()})
        logprobs, content_free = [], []
        for item in items:
            requests = card.content_free_requests(item.choices)
            assert len(requests) == len(item.choices) and len({c for c, _ in requests}) == 1
            pairs = scorer._pairs([c for c, _ in requests], [t for _, t in requests], prompt, ["x"] * len(requests))
            content_free.append([r.logprob for r in scorer.runner.loglikelihood(pairs)])
            logprobs.append(list(decided.loc[decided["item_id"] == item.id, "choice_logprobs"].iloc[0]))
        choices = [item.choices for item in items]
        assert card.decide_batch(logprobs, choices, content_free) == [int(p) for p in decided["pred"]]
        with pytest.raises(ConfigError, match="pass content_free="):
            card.decide_batch(logprobs, choices)


def test_a_pmi_trial_reads_its_decided_tcb(arc):
    """A search trial under pmi (study/trial.py's RunningDecision, as `tcb@pmi` runs it): its dev rows are decided
    by pmi and δ_TCB is read on the decided distribution, the same numbers DecidingScorer gives."""
    from promptopt.scoring.calibration import RunningDecision

    task, scorer, prompt = arc

    class Cached:  # the caching scorer's two entry points on a plain scorer
        def __getattr__(self, name):
            return getattr(scorer, name)

        def score_table(self, p, items):
            return scorer.score(p, items).table

        def score_with_hidden(self, p, items):
            result = scorer.score(p, items)
            return result.table, result.hidden

    pmi = prompt.with_(decision="pmi")
    running = RunningDecision(Cached(), pmi, hidden=True)
    items = task.dev[:6]
    first = running.add(items[:4])
    assert len(first) == 4 and (first["decision"] == "pmi").all()
    running.add(items[4:])
    decided = running.decided()
    expect = DecidingScorer(scorer, running.fitted()).score(pmi, items).table
    assert list(decided["pred"]) == list(expect["pred"])
    assert (decided["tcb_basis"] == "calibrated").all()
    assert np.allclose(decided["tcb"], expect["tcb"], rtol=1e-9)
    assert np.allclose(decided["tcb_raw"], scorer.score(prompt, items).table["tcb"], rtol=1e-9)


def test_searches_take_pmi_on_per_item_choices_and_still_refuse_label_biases(arc):
    """`--decision pmi` / `accuracy@pmi` / a space's `decision: [argmax, pmi]` pass the up-front check on ARC-Easy;
    a per-label bias is still refused there in one line, pointing to pmi."""
    from promptopt.study.context import _check_decisions
    from promptopt.study.space import load_space

    task = arc[0]
    space = load_space("arc_easy")
    _check_decisions("pmi", space, task)
    _check_decisions("pmi:acc", space, task)
    with pytest.raises(ConfigError) as exc:
        _check_decisions("batch", space, task)
    assert "use pmi there" in str(exc.value) and "\n" not in str(exc.value)
