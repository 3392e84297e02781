"""`compare` as an honest experiment: several seeds, top-N winners, paired statistics on the same items,
robust selection. Plumbing on the tiny random model; one end-to-end run on the embedded model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from promptopt.errors import UserError
from promptopt.metrics.stats import mcnemar_exact
from promptopt.study import SearchConfig
from promptopt.workflows.compare import Evaluated, paired_table, run_compare
from promptopt.workflows.compare.choose import choose_winner

PLUMBING_SUITE = str(
    Path(__file__).resolve().parents[1] / "suites" / "plumbing.yaml"
)  # keyboard typos (through the similarity filter), exemplar reorder


def _evaluated(correct, clean=None, variants=None):
    test = pd.DataFrame({"item_id": [f"i{j}" for j in range(len(correct))], "correct": correct})
    return Evaluated(test, {}, clean, variants)


def test_paired_table_against_hand_values():
    a = [True] * 8 + [False] * 2
    b = [True] * 5 + [False] * 5
    clean = pd.Series([True, True, False], index=["x", "y", "z"])
    winners = {
        "baseline": [
            _evaluated(b, clean, pd.DataFrame([("x", "typo", False)], columns=["item_id", "family", "correct"]))
        ],
        "tcb": [_evaluated(a, clean, pd.DataFrame([("x", "typo", True)], columns=["item_id", "family", "correct"]))],
    }
    row = paired_table(winners, seed=0).iloc[0]
    assert (row.a, row.b) == ("baseline", "tcb")
    assert row.delta_acc == pytest.approx(-0.3)
    assert (row.only_a_correct, row.only_b_correct) == (0, 3)
    assert row.mcnemar_p == pytest.approx(mcnemar_exact(b, a)[2]) == pytest.approx(0.25)
    assert row.delta_acc_worst == pytest.approx(1 / 3 - 2 / 3)  # baseline loses x under the typo
    assert row.delta_acc_ci_low <= row.delta_acc <= row.delta_acc_ci_high
    assert not row.significant  # 3 discordant items cannot reach p < 0.05


class _FakeEvaluator:
    robust_limit = None

    def __init__(self, acc_worst):
        self.acc_worst = acc_worst

    def robustness(self, prompt, items):
        return {"acc_worst": self.acc_worst[prompt]}, None, None


def test_select_robust_picks_the_more_robust_of_two_candidates():
    """--select robust is the selection rule with tie-break `robust`: Acc_worst measured for the tied trials only."""

    def entry(number, prompt, right, n=50):
        return {
            "number": number,
            "prompt": prompt,
            "accuracy": right / n,
            "n": n,
            "correct": [i < right for i in range(n)],
        }

    ranked = [entry(3, "brittle", 40), entry(7, "sturdy", 38), entry(9, "sturdier", 20)]  # sturdier: far less accurate
    evaluator = _FakeEvaluator({"brittle": 0.50, "sturdy": 0.70, "sturdier": 0.90})
    measured = []
    evaluator.robustness = lambda prompt, items, f=evaluator.robustness: measured.append(prompt) or f(prompt, items)
    chosen, how = choose_winner("robust", ranked, None, evaluator, dev=[])
    assert chosen["number"] == 7 and "tie-break 'robust'" in how and "2 of 3 candidates tie" in how, how
    assert "(robust 0.700)" in how and measured == ["brittle", "sturdy"]  # the significantly worse one is not stressed

    class _Result:
        selection = "best tcb value on dev"

    assert choose_winner("strategy", ranked, _Result(), evaluator, dev=[])[0]["number"] == 3


@pytest.mark.long
def test_seeds_top_n_and_outputs(tiny_llama_dir, tmp_path):
    config = SearchConfig.build(
        task="sst2",
        trials=3,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "cmp"),
        dev_limit=8,
        test_limit=6,
        minibatch=4,
        device="cpu",
    )
    result = run_compare(config, ["accuracy", "tcb"], seeds=2, top_n=2, suite=None, show_progress=False)
    assert result.table["strategy"].tolist() == ["baseline", "accuracy", "tcb"]
    assert result.table.set_index("strategy").loc["tcb", "n_seeds"] == 2
    runs = result.runs[result.runs["strategy"] != "baseline"]
    assert set(runs["seed"]) == {0, 1} and runs.groupby(["strategy", "seed"])["winner"].sum().eq(1).all()
    assert {(r.a, r.b) for r in result.paired.itertuples()} == {
        ("baseline", "accuracy"),
        ("baseline", "tcb"),
        ("accuracy", "tcb"),
    }
    assert (result.paired["n_pairs"] == 12).all()  # 2 seeds × 6 test items
    summary = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert summary["seeds"] == 2 and summary["evaluations"] + summary["evaluations_reused"] >= 5
    for name in ("compare.csv", "compare.parquet", "compare_runs.csv", "compare_paired.csv"):
        assert (tmp_path / "cmp" / name).is_file()
    assert (tmp_path / "cmp" / "tcb" / "seed1" / "best_card.yaml").is_file()
    again = run_compare(
        config.replace(out=str(tmp_path / "again")),
        ["accuracy", "tcb"],
        seeds=2,
        top_n=2,
        suite=None,
        show_progress=False,
    )
    pd.testing.assert_frame_equal(result.paired, again.paired)  # seeded: the same command prints the same numbers


@pytest.mark.slow
@pytest.mark.long
def test_two_seeds_end_to_end_on_the_embedded_model(embedded_lm, tmp_path):
    config = SearchConfig.build(  # the strategies' own winners (no incumbent): a second prompt must be stressed
        task="sst2",
        trials=2,
        out=str(tmp_path / "e2e"),
        dev_limit=8,
        test_limit=12,
        minibatch=8,
        device="cpu",
        incumbent="none",
        scan="off",
    )
    result = run_compare(
        config, ["ppl", "tcb"], seeds=2, top_n=1, suite=PLUMBING_SUITE, robust_limit=6, show_progress=False
    )
    table = result.table.set_index("strategy")
    assert np.isfinite(table.loc["tcb", ["avg_acc", "acc_worst", "avg_tcb"]].astype(float)).all()
    assert table.loc["ppl", "n_seeds"] == 2 and not np.isnan(table.loc["ppl", "avg_acc_sd"])
    low, worst, high = table.loc["tcb", ["acc_worst_ci_low", "acc_worst", "acc_worst_ci_high"]].astype(float)
    assert low <= worst <= high  # two seeds' winners: the pooled interval, around the mean of the two
    answers = pd.read_parquet(tmp_path / "e2e" / "test_items.parquet")  # every winner's test answers, for `pair`
    assert len(answers) == (1 + 2 * 2) * 12 and set(answers.groupby(["strategy", "seed"]).size()) == {12}
    assert result.paired["mcnemar_p"].between(0, 1).all() and "delta_acc_worst" in result.paired
    # the text variants of an item are the same for every prompt: stressing the second prompt embeds none again
    summary = result.summary
    assert (
        summary["evaluations"] + summary["evaluations_reused"] == 5
    )  # the baseline and 2 strategies x 2 seeds x top 1
    assert summary["evaluations"] >= 2, (
        summary
    )  # a searched winner is not the default prompt: a second prompt is stressed
    assert summary["variant_embedding_hit_rate"] >= 0.4, summary
    assert 0 <= summary["result_cache_hit_rate"] <= 1


def test_robust_strategy_rewards_answers_that_survive_perturbation():
    from promptopt.study import get_strategy
    from promptopt.study.trial import with_robust_correct
    from promptopt.tasks import Item

    items = [Item(f"i{j}", f"question {j}", 0, "a", ("a", "b")) for j in range(4)]

    class FakeCached:  # variant prompts "sturdy" keep every answer; "brittle" loses items i0 and i1
        def score_table(self, prompt, its):
            return pd.DataFrame(
                {
                    "item_id": [i.id for i in its],
                    "correct": [prompt == "sturdy" or i.id not in ("i0", "i1") for i in its],
                }
            )

    clean = pd.DataFrame({"item_id": [i.id for i in items], "correct": [True, True, True, False]})
    robust = get_strategy("robust")
    sturdy = with_robust_correct(clean, [("sturdy", items)], FakeCached())
    brittle = with_robust_correct(clean, [("brittle", items)], FakeCached())
    assert sturdy["robust_correct"].tolist() == [True, True, True, False]
    assert brittle["robust_correct"].tolist() == [False, False, True, False]
    assert robust.values(sturdy)[0] == 0.75 > robust.values(brittle)[0] == 0.25
    assert get_strategy("accuracy").values(sturdy) == get_strategy("accuracy").values(brittle)  # accuracy cannot tell


def test_robust_search_runs_with_cached_variants(tiny_llama_dir, tmp_path):
    from promptopt.errors import ConfigError
    from promptopt.robustness import VariantExpander
    from promptopt.study import run_search

    config = SearchConfig.build(
        task="sst2",
        strategy="robust",
        trials=2,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "rob"),
        dev_limit=6,
        test_limit=4,
        minibatch=3,
        device="cpu",
    )
    with pytest.raises(ConfigError, match="needs perturbed variants"):
        run_search(config, show_progress=False)
    result = run_search(config, expand=VariantExpander("cheap"), show_progress=False)
    metrics = list(result.trials.loc[result.trials["state"] == "COMPLETE", "user_attrs_metrics"])  # multi-fidelity:
    assert metrics and all(
        m["robust_accuracy"] <= m["accuracy"] for m in metrics
    )  # a pruned trial may have no variants


def test_proxy_correlations_on_a_finished_study(tiny_llama_dir, tmp_path):
    from promptopt.analyses.proxy import correlation_table, proxy_correlations
    from promptopt.study import run_search

    prompts = pd.DataFrame(
        {
            "log10_tcb": [0.1, 0.2, 0.3, 0.4],
            "signed_stability": [1, 2, 3, 4],
            "ppl": [4, 3, 2, 1],
            "margin": [1, 3, 2, 4],
            "v_eff": [1, 1, 1, 1],
            "accuracy": [0.5, 0.6, 0.7, 0.8],
            "acc_worst": [0.1, 0.2, 0.3, 0.4],
            "pdr": [0.4, 0.3, 0.2, 0.1],
        }
    )
    table = correlation_table(prompts, n_boot=200).set_index(["signal", "target"])
    assert table.loc[("log10_tcb", "acc_worst"), "spearman"] == pytest.approx(1.0)
    assert table.loc[("ppl", "acc_worst"), "spearman"] == pytest.approx(-1.0)
    assert table.loc[("margin", "pdr"), "spearman"] == pytest.approx(-0.8)
    assert np.isnan(table.loc[("v_eff", "pdr"), "spearman"])

    config = SearchConfig.build(
        task="sst2",
        strategy="accuracy",
        trials=4,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "run"),
        dev_limit=6,
        test_limit=4,
        minibatch=6,
        pruning=False,
        device="cpu",
    )
    run_search(config, show_progress=False)
    result = proxy_correlations(tmp_path / "run", n_trials=3, limit=4, suite=PLUMBING_SUITE, show_progress=False)
    assert len(result.prompts) == 3 and len(result.correlations) == 12
    assert (tmp_path / "run" / "proxy_correlations.csv").is_file()

    # several studies of one task and model pool their trials (distinct prompts only); tables go to their parent
    run_search(config.replace(out=str(tmp_path / "run2"), seed=7, strategy="tcb"), show_progress=False)
    pooled = proxy_correlations(
        [tmp_path / "run", tmp_path / "run2"], n_trials=6, limit=4, suite=PLUMBING_SUITE, show_progress=False
    )
    assert set(pooled.prompts["run"]) == {str(tmp_path / "run"), str(tmp_path / "run2")}
    assert 3 <= len(pooled.prompts) <= 6 and pooled.folder == tmp_path.resolve()
    assert (tmp_path / "proxy_correlations.csv").is_file()
    other = SearchConfig.build(
        task="arc_easy",
        strategy="accuracy",
        trials=3,
        model=str(tiny_llama_dir),
        out=str(tmp_path / "arc"),
        dev_limit=4,
        test_limit=2,
        minibatch=4,
        pruning=False,
        device="cpu",
    )
    run_search(other, show_progress=False)
    with pytest.raises(UserError, match="differ from .*pool runs of one model and task"):
        proxy_correlations([tmp_path / "run", tmp_path / "arc"], n_trials=3, limit=4, show_progress=False)


def test_paired_intervals_resample_items_with_all_their_seeds():
    from promptopt.metrics.stats import bootstrap_resamples
    from promptopt.workflows.compare import Evaluated, cluster_resamples, paired_table

    # a resample (0, 0, 2) of 3 items with two seeds is positions (0, 0, 2) in seed 0's block and (3, 3, 5) in seed 1's
    items = bootstrap_resamples(3, n_boot=4, seed=9).tolist()
    assert cluster_resamples(3, 2, n_boot=4, seed=9).tolist() == [row + [i + 3 for i in row] for row in items]
    rng = np.random.default_rng(0)
    a = Evaluated(pd.DataFrame({"correct": rng.random(40) < 0.7}))
    b = Evaluated(pd.DataFrame({"correct": rng.random(40) < 0.5}))
    one = paired_table({"a": [a], "b": [b]}, seed=0).iloc[0]
    # the same search repeated three times is no new evidence: the interval must not narrow (a pooled
    # bootstrap over 120 "pairs" would shrink it by about √3)
    three = paired_table({"a": [a] * 3, "b": [b] * 3}, seed=0).iloc[0]
    assert three["n_pairs"] == 120 and three["delta_acc"] == one["delta_acc"]
    assert (three["delta_acc_ci_low"], three["delta_acc_ci_high"]) == (
        one["delta_acc_ci_low"],
        one["delta_acc_ci_high"],
    )


def test_the_exact_test_over_seeds_counts_the_baselines_answers_once():
    """compare --seeds 2 pairs the baseline's one set of answers with each seed's winner. The exact test must not
    count those answers twice (McNemar over 2 × 150 pooled pairs): it is the sign-flip test over items, named so,
    and with two seeds that repeat one search it gives that search's p (and the interval its interval)."""
    from promptopt.metrics.stats.binomial import clustered_paired_exact

    rng = np.random.default_rng(11)
    base = Evaluated(pd.DataFrame({"correct": rng.random(150) < 0.6}))
    seed0 = Evaluated(pd.DataFrame({"correct": rng.random(150) < 0.72}))
    seed1 = Evaluated(pd.DataFrame({"correct": rng.random(150) < 0.7}))
    one = paired_table({"s": [seed0], "baseline": [base]}, seed=0).iloc[0]
    assert one["paired_test"] == "exact McNemar"
    repeated = paired_table({"s": [seed0, seed0], "baseline": [base, base]}, seed=0).iloc[0]
    assert repeated["mcnemar_p"] == pytest.approx(one["mcnemar_p"], rel=1e-12) and repeated["n_pairs"] == 300
    two = paired_table({"s": [seed0, seed1], "baseline": [base, base]}, seed=0).iloc[0]
    assert two["paired_test"] == "exact sign-flip over items (2 seeds)"
    a = np.stack([seed0.test["correct"], seed1.test["correct"]])
    b = np.stack([base.test["correct"]] * 2)
    assert two["mcnemar_p"] == clustered_paired_exact(a, b)[2]
    pooled = mcnemar_exact(a.ravel(), b.ravel())[2]
    assert two["mcnemar_p"] > 1.5 * pooled  # what counting the baseline twice claimed


def test_delta_tcb_is_summarised_by_its_median_and_geomean_where_one_item_dominates_the_mean():
    """pmi gave one ARC-Easy item a δ_TCB of 2.78e8 and compare printed a mean of 2.78e6: the table's headline is
    the median (and the geometric mean), the mean stays in the files only."""
    from promptopt.workflows.compare.tables import run_row, strategy_table

    tcb = [3.0, 4.0, 5.0, 2.0, 2.78e8] + [3.5] * 95
    ev = Evaluated(pd.DataFrame({"correct": [True] * 100, "tcb": tcb, "ppl": [1.5] * 100}), {})
    row = run_row("tcb", 0, 0, ev, winner=True, how="best", extra={})
    assert row["avg_tcb"] == pytest.approx(np.mean(tcb))  # 2.78e6: the one item
    assert row["tcb_median"] == 3.5 and row["tcb_geomean"] < 4.5
    table = strategy_table(pd.DataFrame([row]), {"tcb": [ev]}, {})
    assert table.loc[0, "tcb_median"] == 3.5


def test_several_seeds_give_acc_worst_an_interval_that_resamples_items_with_their_seeds():
    """The strategy table's Acc_worst interval over several seeds' winners keeps each item's seeds together, as
    the paired table does: repeating one search narrows nothing, and two seeds that disagree on every item give
    the same pooled Acc_worst (0.5) in every resample of items."""
    from promptopt.workflows.compare.paired import pooled_acc_worst_intervals

    items = [f"i{j}" for j in range(12)]

    def evaluated(clean, variant_ok):
        variants = pd.DataFrame(
            {
                "item_id": [i for i in items for _ in range(2)],
                "family": ["typo", "para"] * len(items),
                "correct": [ok for ok in variant_ok for _ in range(2)],
                "seen": [True, False] * len(items),
            }
        )
        robust = {"families_seen": ["typo"], "families_unseen": ["para"]}
        return Evaluated(
            pd.DataFrame({"item_id": items, "correct": clean}), robust, pd.Series(clean, index=items), variants
        )

    right, wrong = evaluated([True] * 12, [True] * 12), evaluated([False] * 12, [False] * 12)
    split = pooled_acc_worst_intervals([right, wrong], seed=0)
    assert split == {f"acc_worst{s}_ci_{end}": 0.5 for s in ("", "_unseen", "_seen") for end in ("low", "high")}
    rng = np.random.default_rng(1)
    mixed = evaluated(list(rng.random(12) < 0.8), list(rng.random(12) < 0.6))
    one, three = pooled_acc_worst_intervals([mixed], seed=0), pooled_acc_worst_intervals([mixed] * 3, seed=0)
    assert one == three and one["acc_worst_ci_low"] < one["acc_worst_ci_high"]
    no_suite = Evaluated(pd.DataFrame({"item_id": items, "correct": [True] * 12}))
    assert pooled_acc_worst_intervals([no_suite, no_suite], seed=0) == {}


def test_an_ensemble_some_seed_could_not_build_is_left_out_and_said():
    """A seed whose search found fewer distinct trials than the ensemble's members has no such ensemble: pairs are
    (seed, item), so the entry is left out of the tables and the summary says why (SciQ, 2026-12-05: the compare
    failed at its last step with an IndexError instead)."""
    from promptopt.workflows.compare.workflow import left_out_ensembles

    one = object()
    winners = {"baseline": [one] * 3, "accuracy": [one] * 3, "accuracy+ens5": [one] * 2, "accuracy+ens3": [one] * 3}
    assert left_out_ensembles(winners, 3) == {
        "accuracy+ens5": "2 of 3 seeds' searches found enough distinct trials for it"
    }
    assert left_out_ensembles({"accuracy": [one] * 2}, 3) == {}  # a searched entry always has every seed
