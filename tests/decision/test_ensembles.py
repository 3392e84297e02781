"""Ensembles (workflows/ensemble.py, scoring/ensemble.py) and robustness recomputed from answers
(robustness/suite/from_items.py): hand-built selections, an ensemble of identical members answering as the one
prompt, a summary recomputed from a real evaluation's answers equal to the evaluation's own, and a compare with
decision-rule entries and ensembles on a tiny random model (plumbing)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from promptopt.decision import DecisionRule
from promptopt.scoring.ensemble import combined_decisions, ensemble_test
from promptopt.workflows.ensemble import Member, ensemble_items, greedy_select


def _member(name: str, scores: list[list[float]], golds: list[int]) -> Member:
    dev = pd.DataFrame(
        {
            "item_id": [f"i{j}" for j in range(len(scores))],
            "gold": golds,
            "decision_scores": scores,
            "correct": [int(np.argmax(s)) == g for s, g in zip(scores, golds)],
        }
    )
    return Member(prompt=name, rule=DecisionRule(), source={"trial": name}, dev=dev)


def test_greedy_selection_by_hand():
    """Gold is label 0 on four items. a is right on 3 (wrong on i3), b right on 2 (i2, i3), c right on 3 (wrong on
    i0). Step 1 takes a (first of the best singles); step 2: a+b and a+c are both 3/4, a+b comes first in
    order; the trace says so."""
    golds = [0, 0, 0, 0]
    a = _member("a", [[0.0, -3.0], [0.0, -3.0], [0.0, -3.0], [-2.0, 0.0]], golds)
    b = _member("b", [[-1.0, 0.0], [-1.0, 0.0], [0.0, -5.0], [0.0, -5.0]], golds)
    c = _member("c", [[-4.0, 0.0], [0.0, -1.0], [0.0, -1.0], [0.0, -1.0]], golds)
    chosen, trace = greedy_select([a, b, c], 2)
    assert [m.prompt for m in chosen] == ["a", "b"]
    assert trace == [0.75, 1.0]  # a+b: i3 is rescued by b's confidence (−5), i0/i1 stay with a's (−3 vs −1)
    # by hand for a+b on i3: normalized a = [−2.127, −0.127], b = [−0.0067, −5.0067]; means −1.067 vs −2.567 → label 0
    combined = combined_decisions([a.dev, b.dev])
    assert combined["correct"].tolist() == [True, True, True, True]
    with pytest.raises(Exception, match="only 3 distinct candidate prompts"):
        greedy_select([a, b, c], 4)


def test_an_ensemble_of_identical_members_answers_as_the_prompt():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(20, 3)).tolist()
    table = pd.DataFrame(
        {
            "item_id": [f"i{j}" for j in range(20)],
            "gold": rng.integers(0, 3, 20),
            "decision_scores": scores,
            "tcb": rng.uniform(0.5, 4.0, 20),
        }
    )
    out = ensemble_test([table, table, table])
    assert out["pred"].tolist() == [int(np.argmax(s)) for s in scores]
    assert np.allclose(out["tcb"], table["tcb"])  # the minimum over equal members
    other = table.assign(tcb=table["tcb"] / 2)
    assert np.allclose(ensemble_test([table, other])["tcb"], table["tcb"] / 2)  # the most fragile member bounds it


@pytest.fixture(scope="module")
def evaluated(tiny_lm):
    from promptopt.decision import parse_rule
    from promptopt.robustness.suite import evaluate_robustness, load_suite
    from promptopt.scoring import Scorer
    from promptopt.scoring.calibration import DecidingScorer, fit_rule
    from promptopt.tasks import load_task

    task = load_task("sst2")
    prompt = task.default_prompt()
    scorer = DecidingScorer(Scorer(tiny_lm, task), fit_rule(parse_rule("argmax"), Scorer(tiny_lm, task), prompt, []))
    suite = load_suite("quick")
    seen = {"synonym", "typos_keyboard"}
    result = evaluate_robustness(scorer, prompt, task.test[:10], suite, pool=task.pool, seen=seen)
    return result, suite, seen


def test_a_summary_recomputed_from_the_answers_equals_the_evaluation(evaluated):
    from promptopt.robustness.suite.from_items import robustness_from_items

    result, suite, seen = evaluated
    again = robustness_from_items(result.items, suite, seen)
    for key, value in result.summary.items():
        if key not in again:
            continue
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(again[key]), key
        elif isinstance(value, (list, tuple)):
            assert again[key] == pytest.approx(value, nan_ok=True), key
        elif isinstance(value, float):
            assert again[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert again[key] == value, key
    assert {"acc_worst", "pdr", "acc_worst_unseen", "acc_worst_seen", "acc_var_pert"} <= set(again)


def test_an_ensemble_of_one_prompt_twice_keeps_its_answers_under_perturbation(evaluated):
    from promptopt.robustness.suite.from_items import robustness_from_items

    result, suite, seen = evaluated
    items = result.items
    assert items["clean_scores"].notna().all() and items["gold"].notna().all()
    doubled = ensemble_items([items, items])
    variants = items[items["family"].notna()]
    assert len(doubled) == len(items)
    assert doubled["clean_correct"].tolist() == items["clean_correct"].tolist()
    assert sorted(doubled.loc[doubled["family"].notna(), "perturbed_correct"].tolist()) == sorted(
        variants["perturbed_correct"].tolist()
    )
    ours, theirs = robustness_from_items(doubled, suite, seen), result.summary
    for key in ("acc_worst", "acc_worst_unseen", "pdr", "acc_clean"):
        assert ours[key] == pytest.approx(theirs[key], nan_ok=True), key


@pytest.mark.long
def test_a_compare_with_rule_entries_and_ensembles(tiny_llama_dir, tmp_path):
    from promptopt.errors import ConfigError
    from promptopt.study import SearchConfig
    from promptopt.workflows.compare import run_compare
    from promptopt.workflows.export.select import compare_candidates

    config = SearchConfig.build(
        task="sst2",
        trials=4,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "cmp"),
        dev_limit=8,
        test_limit=6,
        minibatch=4,
        device="cpu",
        pruning=False,
    )
    result = run_compare(
        config,
        ["accuracy", "accuracy@batch", "accuracy@affine"],
        suite="quick",
        robust_limit=4,
        ensembles=(2, 3),
        ensemble_of=["accuracy"],
        show_progress=False,
    )
    strategies = result.table["strategy"].tolist()
    assert strategies == [
        "baseline",
        "accuracy",
        "accuracy+ens2",
        "accuracy+ens3",
        "accuracy@batch",
        "accuracy@affine",
    ]
    assert "accuracy@batch+ens2" not in strategies  # only --ensemble-of's searches give ensembles
    paired = result.paired
    assert ((paired["a"] == "accuracy") & (paired["b"] == "accuracy+ens3")).any()
    tests = pd.read_parquet(tmp_path / "cmp" / "test_items.parquet")
    assert set(tests.loc[tests["strategy"] == "accuracy@batch", "decision"]) == {"batch"}
    # ensembles are compared, never exported as one trial: export's candidates are the searches' trials
    assert not compare_candidates(tmp_path / "cmp")["strategy"].str.contains(r"\+ens").any()
    # a study per rule: the entries' studies are named after them
    assert (tmp_path / "cmp" / "accuracy@batch" / "best_card.yaml").is_file()
    # the report reads a compare with ensembles: their rows are in its tables, they have no search of their own
    from promptopt.report import build_report

    page = build_report(tmp_path / "cmp")
    assert "accuracy+ens3" in page and "accuracy@batch" in page
    with pytest.raises(ConfigError, match="unknown decision rule 'batchy'"):
        run_compare(config.replace(out=str(tmp_path / "x")), ["accuracy@batchy"], suite=None, show_progress=False)
    with pytest.raises(ConfigError, match="--ensemble-of: tcb is not one of the compared strategies"):
        run_compare(
            config.replace(out=str(tmp_path / "y")), ["accuracy"], ensembles=(2,), ensemble_of=["tcb"], suite=None
        )
