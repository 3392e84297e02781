"""`promptopt diagnose conflicts`: the four conflict classes and the VCQ / AQ rules on hand-built frames whose
answer is known (every class hit, every threshold edge), per-question means and variances computed by hand,
the seeded exemplar redraw, a Table 3 row, one end-to-end run on the tiny random Llama, and the CLI's one-line
error for a bad --seeds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from promptopt.analyses.diagnose import conflicts as cf
from promptopt.errors import UserError
from promptopt.metrics.stats import wilson_interval
from tests.clirun import promptopt as _cli

ROOT = Path(__file__).resolve().parents[2]


# --- conflict classes ------------------------------------------------------------------------------------------------
def _items() -> pd.DataFrame:
    """Thresholds L = 1, H = 3 on log10 δ and C_L = 0.3, C_H = 0.7 on P(top1); every class hit, edges on the line."""
    rows = [  # item, correct, log10 δ, P(top1), expected classes
        ("au", 1, 0.5, 0.5, "accurate_but_unstable"),
        ("is", 0, 3.5, 0.5, "inaccurate_but_stable"),
        ("cu", 0, 0.5, 0.9, "confident_but_unstable"),
        ("us", 1, 3.5, 0.1, "uncertain_but_stable"),
        ("both", 1, 0.2, 0.95, "accurate_but_unstable+confident_but_unstable"),
        ("edge_low", 1, 1.0, 0.7, ""),  # log δ = L is not below L; P = C_H is not above C_H
        ("edge_high", 0, 3.0, 0.3, ""),  # log δ = H is not above H; P = C_L is not below C_L
        ("inf", 0, math.inf, 0.05, "inaccurate_but_stable+uncertain_but_stable"),  # δ = +inf: stable
    ]
    frame = pd.DataFrame(rows, columns=["item_id", "correct", "log", "top_prob", "expected"])
    frame["tcb"] = 10.0 ** frame["log"]
    frame["margin"] = frame["top_prob"] * 10
    frame["v_eff"] = 1.0 / frame["top_prob"]
    return frame


GIVEN = {"log_tcb_low": 1.0, "log_tcb_high": 3.0, "conf_low": 0.3, "conf_high": 0.7}


def test_every_class_is_hit_and_threshold_edges_stay_out():
    frame = _items()
    th = cf.class_thresholds(frame, **GIVEN)
    items = cf.classify_items(frame, th)
    assert list(items["classes"]) == list(frame["expected"])
    summary = cf.class_summary(items).set_index("class")
    assert list(summary.index) == list(cf.CLASSES)
    assert (summary["count"] == 2).all() and (summary["share"] == 0.25).all()
    low, high = wilson_interval(2, 8)
    assert summary.loc["accurate_but_unstable", "ci_low"] == pytest.approx(low)
    assert summary.loc["accurate_but_unstable", "ci_high"] == pytest.approx(high)
    # groups: 4 correct (au, us, both, edge_low), 4 wrong, 2 confident (cu, both), 2 uncertain (us, inf)
    assert summary["n_group"].to_dict() == {
        "accurate_but_unstable": 4,
        "inaccurate_but_stable": 4,
        "confident_but_unstable": 2,
        "uncertain_but_stable": 2,
    }
    assert summary.loc["accurate_but_unstable", "share_of_group"] == 0.5
    assert summary.loc["confident_but_unstable", "share_of_group"] == 1.0
    assert set(th.table()["how"]) == {"given"}


def test_v_eff_confidence_reads_the_other_way_round():
    frame = _items()  # v_eff = 1 / P(top1): thresholds 1/0.7 and 1/0.3 pick the same items
    th = cf.class_thresholds(
        frame, confidence="v_eff", log_tcb_low=1.0, log_tcb_high=3.0, conf_low=1 / 0.7 - 1e-9, conf_high=1 / 0.3 + 1e-9
    )
    assert list(cf.classify_items(frame, th)["classes"]) == list(frame["expected"])


def test_default_thresholds_are_quartiles_of_finite_log_delta_and_of_the_signal():
    frame = _items()
    th = cf.class_thresholds(frame, confidence="margin")
    logs = np.log10(frame["tcb"][np.isfinite(frame["tcb"])])
    assert th.log_tcb_low == pytest.approx(np.quantile(logs, 0.25))
    assert th.log_tcb_high == pytest.approx(np.quantile(logs, 0.75))
    assert th.conf_low == pytest.approx(np.quantile(frame["margin"], 0.25))
    assert th.conf_high == pytest.approx(np.quantile(frame["margin"], 0.75))
    assert th.how["log_tcb_low"] == "q25 of log10 δ_TCB over 7 items"  # the +inf item sets no quantile
    table = th.table().set_index("threshold")
    assert table.loc["log_tcb_high", "tcb"] == pytest.approx(10**th.log_tcb_high)
    assert "margin_low" in table.index


def test_class_threshold_mistakes_are_user_errors():
    frame = _items()
    with pytest.raises(UserError, match="above high"):
        cf.class_thresholds(frame, log_tcb_low=3.0, log_tcb_high=1.0)
    with pytest.raises(UserError, match="--confidence"):
        cf.class_thresholds(frame, confidence="entropy")
    with pytest.raises(UserError, match="no 'top_prob' column"):
        cf.class_thresholds(frame.drop(columns=["top_prob"]))


# --- VCQ / AQ ------------------------------------------------------------------------------------------------------
def test_per_question_means_and_variances_by_hand():
    runs = pd.DataFrame(
        {
            "seed": [0, 1, 2] * 4,
            "item_id": ["q1"] * 3 + ["q2"] * 3 + ["q3"] * 3 + ["q4"] * 3,
            "split": ["dev"] * 12,
            "correct": [1, 1, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1],
            "tcb": [10.0, 100.0, 1000.0, 100.0, 100.0, 100.0, math.inf, math.inf, math.inf, math.inf, 10.0, 10.0],
            "margin": [1.0, 2.0, 3.0] * 4,
        }
    )
    q = cf.characterise(runs).set_index("item_id")
    assert q.loc["q1", "n_seeds"] == 3
    assert q.loc["q1", "acc_mean"] == pytest.approx(2 / 3) and q.loc["q1", "acc_var"] == pytest.approx(
        2 / 9
    )  # p(1 − p)
    assert q.loc["q1", "log_tcb_mean"] == pytest.approx(2.0) and q.loc["q1", "log_tcb_var"] == pytest.approx(
        2 / 3
    )  # logs 1, 2, 3
    assert q.loc["q1", "tcb_mean"] == pytest.approx(370.0) and q.loc["q1", "margin_mean"] == pytest.approx(2.0)
    assert q.loc["q2", "acc_mean"] == 1.0 and q.loc["q2", "acc_var"] == 0.0 and q.loc["q2", "log_tcb_var"] == 0.0
    assert q.loc["q3", "log_tcb_mean"] == math.inf and q.loc["q3", "log_tcb_var"] == 0.0  # every seed a point mass
    assert q.loc["q4", "log_tcb_mean"] == math.inf and q.loc["q4", "log_tcb_var"] == math.inf  # some seeds
    assert q.loc["q4", "tcb_mean"] == pytest.approx(10.0)


def _questions() -> pd.DataFrame:
    """T_L = 1, T_H = 2, V_L = 0.1, V_H = 0.5; acc rules the paper's."""
    rows = [  # item, acc mean, acc var, mean log δ, log δ var, expected set, AQ reasons
        ("vcq_edges", 0.9, 0.05, 2.0, 0.1, "VCQ", ""),  # every VCQ bound met with equality
        ("vcq", 1.0, 0.0, 3.0, 0.0, "VCQ", ""),
        ("aq_acc", 0.5, 0.0, 3.0, 0.0, "AQ", "acc<0.6"),
        ("aq_acc_var", 1.0, 0.2, 3.0, 0.0, "AQ", "acc_var>0.15"),
        ("aq_low", 1.0, 0.0, 0.5, 0.0, "AQ", "log_tcb<T_L"),
        ("aq_spread", 1.0, 0.0, 2.5, 0.6, "AQ", "log_tcb_var>V_H"),
        ("aq_all", 0.3, 0.21, 0.5, 0.6, "AQ", "acc<0.6;acc_var>0.15;log_tcb<T_L;log_tcb_var>V_H"),
        ("aq_edges", 0.6, 0.15, 1.0, 0.5, "neither", ""),  # every AQ bound met with equality: not AQ
        ("middle", 1.0, 0.0, 1.5, 0.05, "neither", ""),  # stable enough for neither set
        ("not_vcq_var", 1.0, 0.0, 2.5, 0.2, "neither", ""),
        ("inf_spread", 1.0, 0.0, math.inf, math.inf, "AQ", "log_tcb_var>V_H"),
    ]
    return pd.DataFrame(
        rows, columns=["item_id", "acc_mean", "acc_var", "log_tcb_mean", "log_tcb_var", "expected", "reasons"]
    )


def test_vcq_and_aq_rules_with_edges():
    questions = _questions()
    th = cf.set_thresholds(questions, t_low=1.0, t_high=2.0, v_low=0.1, v_high=0.5)
    labelled = cf.label_questions(questions, th)
    assert list(labelled["set"]) == list(questions["expected"])
    assert list(labelled["aq_reasons"]) == list(questions["reasons"])
    assert not (labelled["vcq"] & labelled["aq"]).any()
    table = th.table().set_index("threshold")
    assert table.loc["t_high", "tcb"] == pytest.approx(100.0) and table.loc["aq_acc", "how"] == "paper"


def test_set_thresholds_default_to_quantiles_of_dev_questions_only():
    dev = pd.DataFrame(
        {
            "item_id": list("abcde"),
            "split": "dev",
            "log_tcb_mean": [0.0, 1.0, 2.0, 3.0, 4.0],
            "log_tcb_var": [0.0, 0.1, 0.2, 0.3, 0.4],
        }
    )
    test = pd.DataFrame(
        {"item_id": ["x", "y"], "split": "test", "log_tcb_mean": [100.0, 200.0], "log_tcb_var": [9.0, 9.0]}
    )
    th = cf.set_thresholds(pd.concat([dev, test], ignore_index=True))
    assert (th.t_low, th.t_high, th.v_low, th.v_high) == pytest.approx((1.0, 2.0, 0.3, 0.3))
    assert th.how["t_low"] == "q25 of log_tcb_mean over 5 dev questions"
    assert cf.set_thresholds(dev, t_high=3.5).t_high == 3.5
    with pytest.raises(UserError, match="T_L"):
        cf.set_thresholds(dev, t_low=3.0, t_high=1.0)
    with pytest.raises(UserError, match="V_L"):
        cf.set_thresholds(dev, v_low=1.0)
    custom = cf.set_thresholds(dev, quantiles={"v_low": 0.5})
    assert custom.v_low == pytest.approx(0.2) and custom.how["v_low"] == "q50 of log_tcb_var over 5 dev questions"


def test_set_summary_counts_per_split():
    labelled = cf.label_questions(
        _questions().assign(split=["dev"] * 6 + ["test"] * 5),
        cf.set_thresholds(_questions(), t_low=1.0, t_high=2.0, v_low=0.1, v_high=0.5),
    )
    s = cf.set_summary(labelled).set_index(["split", "set"])
    assert s.loc[("dev", "VCQ"), "n"] == 2 and s.loc[("dev", "AQ"), "n"] == 4 and s.loc[("test", "AQ"), "n"] == 2
    assert s.loc[("dev", "AQ"), "seeds_acc_mean"] == pytest.approx((0.5 + 1 + 1 + 1) / 4)


# --- baseline prompts, Table 3 row ------------------------------------------------------------------------------------
def test_baseline_prompts_redraw_k_pool_exemplars_per_seed():
    from promptopt.prompts import Prompt
    from promptopt.tasks import Item

    pool = [
        Item(f"p{i}", f"sentence {i}", i % 2, ["negative", "positive"][i % 2], ("negative", "positive"))
        for i in range(20)
    ]
    prompt = Prompt(task="t", instruction="Classify.", exemplars=tuple(p.as_exemplar() for p in pool[:3]))
    drawn = cf.baseline_prompts(prompt, pool, 4, seed=7)
    assert len(drawn) == 4
    assert all(len(p.exemplars) == 3 and len({e.id for e in p.exemplars}) == 3 for p in drawn)
    assert all(p.instruction == "Classify." and p.template == prompt.template for p in drawn)
    assert len({tuple(e.id for e in p.exemplars) for p in drawn}) > 1
    assert [p.exemplars for p in cf.baseline_prompts(prompt, pool, 4, seed=7)] == [p.exemplars for p in drawn]
    zero = Prompt(task="t")
    assert cf.baseline_prompts(zero, pool, 2) == [zero, zero]
    with pytest.raises(UserError, match="pool has only"):
        cf.baseline_prompts(prompt, pool[:2], 2)


def test_table3_row_and_the_papers_rows():
    clean = pd.DataFrame(
        {
            "correct": [1, 1, 0, 1],
            "tcb": [10.0, 1000.0, math.inf, 100.0],
            "v_eff": [1.0, 2.0, 3.0, 2.0],
            "margin": [1.0, 2.0, 3.0, 6.0],
        }
    )
    robust = {
        "suite": "quick",
        "acc_var_pert": 0.1,
        "acc_var_pert_ci95": [0.0, 0.2],
        "pdr": 0.25,
        "pdr_ci95": [0.1, 0.4],
        "acc_worst": 0.5,
        "acc_worst_ci95": [0.25, 0.75],
    }
    row = cf.table3_row("AQ", "baseline", clean, robust)
    assert (
        row["n"] == 4
        and row["acc"] == 0.75
        and (row["acc_ci_low"], row["acc_ci_high"]) == pytest.approx(wilson_interval(3, 4))
    )
    assert (
        row["tcb_mean"] == pytest.approx(370.0)
        and row["tcb_geomean"] == pytest.approx(100.0)
        and row["tcb_infinite"] == 1
    )
    assert row["v_eff_mean"] == 2.0 and row["margin_mean"] == 3.0
    assert (row["pdr"], row["pdr_ci_low"], row["pdr_ci_high"], row["acc_worst"]) == (0.25, 0.1, 0.4, 0.5)
    paper = pd.DataFrame(cf.paper_table3_rows()).set_index(["source", "set", "prompt"])
    assert len(paper) == 8
    assert paper.loc[("paper MMLU", "AQ", "baseline"), "tcb_mean"] == 1983.0
    assert paper.loc[("paper MMLU", "AQ", "enhanced"), "pdr"] == pytest.approx(0.10)  # printed as "10" (%)
    assert paper.loc[("paper GSM8K", "VCQ", "enhanced"), "acc_worst"] == 0.85


# --- end to end on the tiny random Llama ------------------------------------------------------------------------------
def test_run_conflicts_end_to_end_on_a_tiny_model(tiny_llama_dir, tmp_path):
    from promptopt.analyses.diagnose.workflows import run_conflicts
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig
    from promptopt.workflows.session import Session

    out = tmp_path / "diag"
    session = Session(model=ModelConfig(spec=str(tiny_llama_dir), device="cpu"), data=DataConfig(task="sst2"), out=out)
    report = run_conflicts(session, out, limit=12, seeds=2, trials=3)
    r = report.result
    for stem in (
        "conflicts_items",
        "conflicts_classes",
        "conflicts_thresholds",
        "conflicts_runs",
        "conflicts_questions",
        "conflicts_sets",
        "conflicts_table3",
    ):
        for suffix in (".parquet", ".csv"):
            assert (out / f"{stem}{suffix}").is_file(), stem + suffix
    assert (out / "conflicts.png").stat().st_size > 1000 and (out / "conflicts_search" / "best_card.yaml").is_file()
    items = pd.read_parquet(out / "conflicts_items.parquet")
    assert len(items) == 24 and {
        "split",
        "correct",
        "tcb",
        "log10_tcb",
        "top_prob",
        "margin",
        "v_eff",
        "classes",
        *cf.CLASSES,
    } <= set(items.columns)
    assert list(pd.read_parquet(out / "conflicts_classes.parquet")["class"]) == list(cf.CLASSES)
    runs = pd.read_parquet(out / "conflicts_runs.parquet")
    assert (
        len(runs) == 2 * 24 and set(runs["seed"]) == {0, 1} and runs.groupby("seed")["exemplars"].nunique().eq(1).all()
    )
    questions = pd.read_parquet(out / "conflicts_questions.parquet")
    assert len(questions) == 24 and (questions["n_seeds"] == 2).all()
    assert {"acc_mean", "acc_var", "log_tcb_mean", "log_tcb_var", "vcq", "aq", "set", "aq_reasons"} <= set(
        questions.columns
    )
    table3 = pd.read_parquet(out / "conflicts_table3.parquet")
    ours = table3[table3["source"] == "ours"]
    n_aq_test = int(((questions["split"] == "test") & (questions["set"] == "AQ")).sum())
    n_vcq_test = int(((questions["split"] == "test") & (questions["set"] == "VCQ")).sum())
    assert list(ours.loc[ours["set"] == "AQ", "prompt"]) == ["baseline", "enhanced"]
    assert (ours.loc[ours["set"] == "AQ", "n"] == n_aq_test).all()
    assert len(ours[ours["set"] == "VCQ"]) == (2 if n_vcq_test else 0)
    for name in (
        "acc",
        "acc_ci_low",
        "tcb_mean",
        "v_eff_mean",
        "margin_mean",
        "acc_var_pert",
        "pdr",
        "acc_worst",
        "acc_worst_ci_high",
    ):
        assert name in table3.columns
    assert (ours["suite"] == "quick").all() and ours["acc"].between(0, 1).all()
    assert len(table3[table3["source"].str.startswith("paper")]) == 8
    # the search saw the AQ dev items only
    aq_dev = set(questions.loc[(questions["split"] == "dev") & (questions["set"] == "AQ"), "item_id"])
    searched = len(r.search.trials) - (r.search.incumbent is not None)  # the incumbent's trial is not the budget's
    assert r.search.dev["n"] == len(aq_dev) and searched == 3
    import json

    assert set(json.loads((out / "conflicts_search" / "splits.json").read_text())["dev"]) == aq_dev
    # the same AQ dev set again: its study is resumed (scores come from the cache), and too few AQ items is one error
    again = run_conflicts(session, out, limit=12, seeds=2, trials=3)
    assert any("resumed" in note for note in again.result.notes)
    with pytest.raises(UserError, match="AQ dev item"):
        run_conflicts(session, out, limit=12, seeds=2, trials=3, min_aq_dev=1000)


# --- CLI -----------------------------------------------------------------------------------------------------------------


def test_cli_diagnose_conflicts_rejects_one_seed_in_one_line(tiny_llama_dir, tmp_path):
    run = _cli(
        "diagnose",
        "conflicts",
        "--model",
        str(tiny_llama_dir),
        "--device",
        "cpu",
        "--task",
        "sst2",
        "--seeds",
        "1",
        "--out",
        str(tmp_path / "diag"),
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --seeds 1:"), run.stderr
