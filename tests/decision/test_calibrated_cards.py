"""A calibrated card and an ensemble card, round trip on the embedded model and real SST-2 items:
compare (one argmax search, one batch-calibrated) -> export (a batch card; a 3-member ensemble card chosen on
dev) -> verify reproduces the recorded score -> load_prompt (torch-free) decides every one of 100 test items as
the scorer did."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from promptopt.study import SearchConfig
from promptopt.workflows.compare import run_compare
from promptopt.workflows.export import export_run
from promptopt.workflows.verify import verify_card

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("calibrated") / "cmp"
    config = SearchConfig.build(
        task="sst2", trials=3, dev_limit=16, test_limit=100, out=str(out), seed=5, pruning=False, device="cpu"
    )
    result = run_compare(config, ["accuracy", "accuracy@batch"], top_n=1, suite=None, show_progress=False)
    return out, result


def _scorer_decisions(card_path, split="test", cache_from=None):
    """The per-item decisions of the card as the scorer makes them (scoring/card_answers.py) and the per-member
    log-probabilities the scorer computed, which production code would compute with its own model."""
    from promptopt.models.load import ModelConfig
    from promptopt.scoring.card_answers import answer_table, card_members
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows.session import Session

    card = yaml.safe_load(card_path.read_text())
    # cache_from: the compare's folder, whose result cache holds the members' rows (verify re-scores them uncached)
    session = Session(
        model=ModelConfig(spec=card["model"]["spec"], device="cpu"), data=DataConfig(task="sst2"), out=cache_from
    )
    by_id = {i.id: i for role in ("dev", "test") for i in session.data.split(role)}
    items = [by_id[i] for i in card["data"]["test_ids"]] if split == "test" else session.data.split("dev")[:16]
    members = card_members(card)
    table = answer_table(session.scorer, members, items)
    if split == "dev":
        raw = session.scorer.score(members[0].prompt, items).table
        table = table.assign(choice_logprobs_raw=raw["choice_logprobs"].tolist())
    logprobs = [session.scorer.score(m.prompt, items).table["choice_logprobs"].tolist() for m in members]
    return items, table, logprobs


def test_a_batch_calibrated_card_round_trips(compared, tmp_path):
    out, result = compared
    assert set(result.table["strategy"]) >= {"accuracy", "accuracy@batch"}
    card_path = tmp_path / "batch.yaml"
    exported = export_run(out, out=card_path, strategy="accuracy@batch")
    card = exported.card
    assert card["decision"]["rule"] == "batch" and card["decision"]["mode"] == "stored"
    assert card["decision"]["fitted_on"]["split"] == "dev" and card["decision"]["fitted_on"]["n"] == 16
    assert abs(sum(card["decision"]["bias"])) < 1e-12  # centered
    assert card["metrics"]["test"]["n"] == 100

    verified = verify_card(card_path, device="cpu")
    assert verified.ok, verified.lines()
    assert verified.accuracy == card["metrics"]["test"]["accuracy"] and not verified.flipped

    items, table, logprobs = _scorer_decisions(card_path, cache_from=out)
    import promptopt

    loaded = promptopt.load_prompt(card_path)
    assert loaded.decision.kind == "batch"
    decided = loaded.decide_batch(logprobs[0])
    assert decided == [int(p) for p in table["pred"]]  # 100/100
    assert "".join("1" if d == i.gold else "0" for d, i in zip(decided, items)) == card["metrics"]["test"]["correct"]


def test_a_rule_search_decides_every_trial_by_its_rule(compared, tmp_path):
    """`accuracy@batch`'s trials are valued by batch-calibrated dev accuracy, not argmax: every trial's value is its
    prompt's dev answers decided by the batch bias fit on those dev items, computed here from the raw log-probs."""
    import json

    import pandas as pd

    from promptopt.decision import normalized

    out, _ = compared
    card_path = tmp_path / "batch.yaml"
    export_run(out, out=card_path, strategy="accuracy@batch")
    session_items, table, _ = _scorer_decisions(card_path, split="dev", cache_from=out)
    rows = [normalized(list(r)) for r in table["choice_logprobs_raw"]]
    bias = [sum(column) / len(rows) for column in zip(*rows)]  # the mean label-normalized log-prob per label
    decided = [max(range(len(r)), key=lambda k: r[k] - bias[k]) for r in rows]
    batch_accuracy = sum(d == i.gold for d, i in zip(decided, session_items)) / len(session_items)
    argmax_accuracy = sum(max(range(len(r)), key=r.__getitem__) == i.gold for r, i in zip(rows, session_items))
    argmax_accuracy /= len(session_items)
    assert batch_accuracy != argmax_accuracy  # else this test could not tell the rules apart
    summary = json.loads((out / "accuracy@batch" / "summary.json").read_text())
    trials = pd.read_parquet(out / "accuracy@batch" / "trials.parquet")
    best = trials[trials["number"] == summary["best_trial"]].iloc[0]
    assert json.loads(best["user_attrs_metrics"])["accuracy"] == pytest.approx(batch_accuracy, abs=1e-12)


def test_an_ensemble_card_round_trips(compared, tmp_path):
    out, _ = compared
    card_path = tmp_path / "ensemble.yaml"
    card = export_run(out, out=card_path, ensemble=3).card
    members = card["ensemble"]["members"]
    assert len(members) == 3 and card["ensemble"]["forwards_per_input"] == 3
    assert "greedy forward selection of 3 members on 16 dev items" in card["ensemble"]["selection"]
    assert "no test number was read" in card["ensemble"]["selection"]
    assert {m["decision"]["rule"] for m in members} <= {"argmax", "batch"}

    verified = verify_card(card_path, device="cpu")
    assert verified.ok, verified.lines()
    assert verified.accuracy == card["metrics"]["test"]["accuracy"]

    items, table, logprobs = _scorer_decisions(card_path, cache_from=out)
    import promptopt

    loaded = promptopt.load_prompt(card_path)
    assert len(loaded.members) == 3
    rows = [[logprobs[k][i] for k in range(3)] for i in range(len(items))]
    assert loaded.decide_batch(rows) == [int(p) for p in table["pred"]]  # 100/100
    # the ensemble's δ_TCB is the minimum over its members, item by item
    assert card["metrics"]["test"]["tcb_mean"] <= min(m["tcb_mean"] for m in members) + 1e-9


def test_lm_eval_export_refuses_what_it_cannot_express(compared, tmp_path):
    out, _ = compared
    from promptopt.errors import UserError

    with pytest.raises(UserError, match="--format lm-eval cannot express its batch decision rule"):
        export_run(out, out=tmp_path / "task.yaml", strategy="accuracy@batch", fmt="lm-eval")
    with pytest.raises(UserError, match="--format lm-eval cannot express an ensemble"):
        export_run(out, out=tmp_path / "task.yaml", ensemble=2, fmt="lm-eval")
    assert not (tmp_path / "task.yaml").exists() and not (tmp_path / "task.jsonl").exists()


def test_the_production_helper_stays_torch_free(compared, tmp_path):
    out, _ = compared
    card_path = tmp_path / "batch.yaml"
    export_run(out, out=card_path, strategy="accuracy@batch")
    code = (
        "import sys, promptopt; c = promptopt.load_prompt(sys.argv[1]); "
        "print(c.decide([-0.1, -2.0]), c.decide_batch([[-0.1, -2.0], [-3.0, -0.2]]), "
        "'torch' in sys.modules, 'numpy' in sys.modules)"
    )
    printed = subprocess.run([sys.executable, "-c", code, str(card_path)], capture_output=True, text=True, check=True)
    assert printed.stdout.split()[-2:] == ["False", "False"]


def test_select_robust_decides_each_prompt_by_its_own_rule(compared, monkeypatch):
    """`export --select robust` stresses each candidate on dev items with its answers decided as its card would
    decide them (the batch bias fit on those dev items), not by argmax, and reports that stress's Acc_worst."""
    import re

    import promptopt.robustness.suite as suite_module
    from promptopt.scoring.calibration import DecidingScorer
    from promptopt.workflows.export.robust import select_robust
    from promptopt.workflows.export.select import compare_candidates, strategy_rows

    out, _ = compared
    real, calls = suite_module.evaluate_robustness, []

    def recorded(scorer, prompt, items, *args, **kwargs):
        result = real(scorer, prompt, items, *args, **kwargs)
        calls.append((scorer, prompt, items, result.summary["acc_worst"]))
        return result

    monkeypatch.setattr(suite_module, "evaluate_robustness", recorded)
    candidates = strategy_rows(compare_candidates(out), "accuracy@batch", out)
    row, session = select_robust(out, candidates, device="cpu", limit=8)  # 8 dev items: the plumbing is the point
    ((scorer, prompt, items, acc_worst),) = calls
    assert prompt.decision == "batch" and isinstance(scorer, DecidingScorer)
    rule = scorer.rule
    assert rule.kind == "batch" and rule.fitted_on["split"] == "dev" and rule.fitted_on["n"] == len(items) == 8
    reported = float(re.search(r"\(robust ([0-9.]+)\)", row["selection"]).group(1))
    assert reported == pytest.approx(acc_worst, abs=5e-4)


def test_score_evaluate_and_diagnose_answer_as_the_card_decides(compared, tmp_path, monkeypatch):
    """`promptopt score` and `promptopt evaluate` with a calibrated card decide by the card's stored rule (they
    decided by argmax, silently: 0.695 against the card's 0.87 on SST-2); `score` combines an ensemble card's
    members as served; `evaluate` refuses an ensemble card in one line, `diagnose conflicts` a calibrated one."""
    import promptopt.robustness.suite as suite_module
    from promptopt.errors import UserError
    from promptopt.models.load import ModelConfig
    from promptopt.scoring.calibration import DecidingScorer
    from promptopt.tasks.data import DataConfig
    from promptopt.workflows import evaluate
    from promptopt.workflows.session import Session

    out, _ = compared
    batch_card, ensemble_card = tmp_path / "batch.yaml", tmp_path / "ensemble.yaml"
    export_run(out, out=batch_card, strategy="accuracy@batch")
    export_run(out, out=ensemble_card, ensemble=3)
    session = Session(
        model=ModelConfig(spec="smollm2-135m-instruct", device="cpu"), data=DataConfig(task="sst2"), out=out
    )
    test = session.data.split("test")[:100]
    gold = {i.id: i.gold for i in test}
    for card_path in (batch_card, ensemble_card):
        card = yaml.safe_load(card_path.read_text())
        assert [i.id for i in test] == card["data"]["test_ids"]
        _, decided, _ = _scorer_decisions(card_path, cache_from=out)
        scored = evaluate.score(session, card=card_path, split="test", limit=100).table
        assert [int(p) for p in scored["pred"]] == [int(p) for p in decided["pred"]]  # 100/100
        accuracy = sum(int(p) == gold[i] for p, i in zip(scored["pred"], scored["item_id"])) / 100
        assert accuracy == card["metrics"]["test"]["accuracy"]
        if card_path == batch_card:  # argmax answers otherwise: the test tells the two apart
            raw = session.scorer.score(session.prompt(batch_card), test).table
            assert [int(p) for p in raw["pred"]] != [int(p) for p in scored["pred"]]

    # the search's own card (version 1) names its rule and records it fitted: answered the same way
    search_card = out / "accuracy@batch" / "best_card.yaml"
    assert yaml.safe_load(search_card.read_text())["decision"] == "batch"
    own = evaluate.score(session, card=search_card, split="test", limit=100).table
    exported = evaluate.score(session, card=batch_card, split="test", limit=100).table
    assert [int(p) for p in own["pred"]] == [int(p) for p in exported["pred"]]

    real, calls = suite_module.evaluate_robustness, []

    def recorded(scorer, prompt, items, *args, **kwargs):
        calls.append(scorer)
        return real(scorer, prompt, items[:4], *args, **kwargs)

    monkeypatch.setattr(suite_module, "evaluate_robustness", recorded)
    evaluate.evaluate(session, card=batch_card, suite="quick", split="test", limit=4)
    assert isinstance(calls[0], DecidingScorer) and calls[0].rule.kind == "batch"
    with pytest.raises(UserError, match="is an ensemble card \\(3 members\\)"):
        evaluate.evaluate(session, card=ensemble_card, suite="quick", split="test", limit=4)

    from promptopt.analyses.diagnose.workflows import run_conflicts

    with pytest.raises(UserError, match="decides by batch; the conflicts protocol"):
        run_conflicts(session, tmp_path / "conflicts", card=batch_card)
