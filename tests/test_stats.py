"""Statistics against hand-computed values: robustness metrics on the same items (with unequal family
coverage and an item that flips under one variant only), exact McNemar, seeded bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from promptopt.metrics.stats import bootstrap_interval, mcnemar_exact, robustness_intervals, robustness_metrics

CLEAN = {"a": True, "b": True, "c": False, "d": True}
VARIANTS = pd.DataFrame(
    [
        ("a", "synonym", True),
        ("b", "synonym", False),
        ("c", "synonym", False),
        ("d", "synonym", True),
        ("a", "reorder", True),  # reorder covers item a only
        ("b", "typo", True),
        ("b", "typo", True),
        ("d", "typo", False),
    ],  # d flips under one variant only
    columns=["item_id", "family", "correct"],
)


def test_robustness_metrics_by_hand():
    m = robustness_metrics(CLEAN, VARIANTS)
    assert m["acc_clean"] == 0.75
    assert m["pdr_by_family"] == pytest.approx({"reorder": 0.0, "synonym": 1 / 3, "typo": 1 / 3})
    assert m["pdr"] == pytest.approx(2 / 9)  # mean of per-family PDRs
    assert m["pdr_pooled"] == pytest.approx(2 / 7)  # 1 − (5/8) / (7/8)
    assert m["acc_worst"] == 0.25  # only a is right clean and under every variant
    assert (m["acc_worst_family"], m["acc_worst_family_min"]) == ("synonym", 0.5)
    assert m["acc_var"] == pytest.approx((0 + 3 / 16 + 0 + 2 / 9) / 4)  # per-item variance over versions
    assert m["acc_var_families"] == pytest.approx(np.var([0.5, 1.0, 2 / 3]))
    # the old summary (mean family accuracy over clean accuracy on all items) would say 0.037
    assert 1 - np.mean([0.5, 1.0, 2 / 3]) / 0.75 == pytest.approx(0.037, abs=1e-3)


def test_items_without_variants_count_with_their_clean_answer():
    m = robustness_metrics({"a": True, "b": False, "c": True}, VARIANTS.iloc[[0, 4]])  # variants of a only
    assert m["acc_worst"] == pytest.approx(2 / 3) and m["acc_var"] == 0.0 and m["pdr"] == 0.0


def test_robustness_intervals_are_seeded_and_cover_the_estimate():
    clean = {f"i{j}": j % 3 != 0 for j in range(60)}
    rows = [(f"i{j}", "typo", (j % 3 != 0) and j % 7 != 0) for j in range(60)]
    first = robustness_intervals(clean, rows, n_boot=300, seed=5)
    assert first == robustness_intervals(clean, rows, n_boot=300, seed=5)
    point = robustness_metrics(clean, pd.DataFrame(rows, columns=["item_id", "family", "correct"]))
    for name in ("acc_worst", "acc_var", "pdr", "pdr_pooled"):
        low, high = first[f"{name}_ci95"]
        assert low <= point[name] <= high and high - low > 0


def test_resampled_metrics_are_the_per_resample_metrics_bit_for_bit():
    """robustness_intervals computes every resample at once: each resample's four numbers are exactly what
    `metrics(resample)` gives, NaN where it gives NaN, including resamples that miss a family (no PDR for
    it), a family whose items are all wrong clean (PDR undefined) and items without a variant."""
    from promptopt.metrics.stats import PerItemRobustness, bootstrap_resamples

    clean = dict(CLEAN, e=False, f=True)  # e: wrong clean, its only family 'hard' then has PDR undefined; f: no variant
    variants = pd.concat([VARIANTS, pd.DataFrame([("e", "hard", True)], columns=VARIANTS.columns)])
    per_item = PerItemRobustness(clean, variants)
    resamples = np.vstack([bootstrap_resamples(6, n_boot=200, seed=2), [[5] * 6], [[4] * 6]])  # + only f, only e
    together = per_item.resampled_metrics(resamples)
    seen_nan = set()
    for row, index in enumerate(resamples):
        alone = per_item.metrics(index)
        for name in ("acc_worst", "acc_var", "pdr", "pdr_pooled"):
            if alone[name] != alone[name]:
                seen_nan.add(name)
                assert np.isnan(together[name][row]), (name, index)
            else:
                assert together[name][row] == alone[name], (name, index)
    assert seen_nan == {"pdr", "pdr_pooled"}  # the resample of f alone has no variant at all


def test_auroc_and_family_pdr_intervals_are_their_loops_bit_for_bit():
    """Both intervals compute every resample at once; each is exactly `bootstrap_interval` over the scalar
    statistic: AUROC with ties, a NaN and infinite scores left out, and a class missing from some resamples;
    a family's pooled PDR where some resamples have no clean answer right (PDR undefined, dropped)."""
    from promptopt.experiments.report.families import _pdr_interval
    from promptopt.metrics.stats import auroc, auroc_interval, performance_drop_rate

    scores = np.array([0.3, 0.1, 0.3, np.nan, 0.9, -np.inf, 0.5, 0.5, np.inf, 0.2, 0.7, 0.4])
    labels = np.array([1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0], dtype=bool)
    loop = bootstrap_interval(lambda idx: auroc(scores[idx], labels[idx]), len(scores), n_boot=500, seed=11)
    assert auroc_interval(scores, labels, n_boot=500, seed=11) == loop and loop[0] < loop[1]
    assert all(math.isnan(v) for v in auroc_interval(scores, np.ones(12, dtype=bool)))  # no negative answer: no AUROC

    count = np.array([2.0, 1.0, 3.0, 1.0, 2.0, 1.0])
    clean = np.array([0.0, 0.0, 3.0, 0.0, 0.0, 1.0])  # most resamples miss items 2 and 5
    perturbed = np.array([1.0, 1.0, 1.0, 0.0, 2.0, 0.0])

    def pdr(idx):
        total = count[idx].sum()
        return performance_drop_rate(clean[idx].sum() / total, perturbed[idx].sum() / total)

    loop = bootstrap_interval(pdr, len(count), n_boot=500, seed=2)
    assert _pdr_interval(clean, perturbed, count, n_boot=500, seed=2) == loop and loop[0] < loop[1]


def test_mcnemar_exact_by_hand():
    a = [True] * 5 + [False] + [True] * 4
    b = [False] * 5 + [True] + [True] * 4
    assert mcnemar_exact(a, b) == (5, 1, pytest.approx(14 / 64))  # 2 · (C(6,0) + C(6,1)) / 2^6
    assert mcnemar_exact(a, a) == (0, 0, 1.0)
    assert mcnemar_exact([True] * 10, [False] * 10)[2] == pytest.approx(2 / 1024)
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_bootstrap_interval_known_cases():
    values = np.array([0.0, 1.0] * 50)
    low, high = bootstrap_interval(lambda idx: values[idx].mean(), 100, n_boot=2000, seed=0)
    assert 0.38 < low < 0.43 and 0.57 < high < 0.62  # ≈ 0.5 ± 1.96·0.05
    assert bootstrap_interval(lambda idx: 3.0, 10, seed=1) == (3.0, 3.0)
    assert (low, high) == bootstrap_interval(lambda idx: values[idx].mean(), 100, n_boot=2000, seed=0)


def test_spearman_against_hand_values():
    from promptopt.metrics.stats import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x = 1,2,3,4; y = 1,3,2,4 -> 1 − 6·Σd²/(n(n²−1)) = 1 − 6·2/60 = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_auroc_against_hand_counts():
    from promptopt.metrics.stats import auroc, auroc_interval

    # positives 0.9, 0.4; negatives 0.8, 0.4, 0.1: pairs (0.9>0.8, 0.9>0.4, 0.9>0.1, 0.4<0.8, 0.4=0.4, 0.4>0.1) = 4.5 / 6
    scores, labels = [0.9, 0.8, 0.4, 0.4, 0.1], [1, 0, 1, 0, 0]
    assert auroc(scores, labels) == pytest.approx(4.5 / 6)
    assert auroc([-s for s in scores], labels) == pytest.approx(1.5 / 6)  # the reversed signal
    assert auroc([1, 2, float("nan")], [0, 1, 1]) == 1.0  # a missing score is left out
    assert math.isnan(auroc([1, 2], [1, 1]))
    low, high = auroc_interval(scores, labels, n_boot=300, seed=1)
    assert 0 <= low <= 4.5 / 6 <= high <= 1


def test_average_ranks_and_spearman_by_hand():
    from promptopt.metrics.stats import average_ranks, spearman

    # 3 and 3 share positions 3 and 4 -> rank 3.5 each; the NaN-free values keep their order
    assert average_ranks([3.0, 1.0, 3.0, 2.0]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([5.0, 5.0, 5.0]).tolist() == [2.0, 2.0, 2.0]
    # ranks x = (1, 2, 3, 4), y = (2, 1, 4, 3): d² = 1+1+1+1 = 4, ρ = 1 − 6·4 / (4·15) = 0.6
    assert spearman([10, 20, 30, 40], [2, 1, 4, 3]) == pytest.approx(0.6)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2, float("nan")], [1, 2, 3]))


def test_spearman_interval_is_the_bootstrap_of_spearman_all_at_once():
    """The vectorized interval ranks every resample at once: the ranks row by row are the 1-D ones, the resamples
    are bootstrap_interval's, and the interval is the loop's up to the last bits, resamples where one side is
    constant dropped as the loop drops their NaN."""
    import numpy as np

    from promptopt.metrics.stats import (
        average_ranks,
        bootstrap_interval,
        bootstrap_resamples,
        spearman,
        spearman_interval,
    )

    assert average_ranks([[3.0, 1.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [4.0, 3.0, 2.0, 1.0]]).tolist() == [
        [3.5, 1.0, 3.5, 2.0],
        [2.5, 2.5, 2.5, 2.5],
        [4.0, 3.0, 2.0, 1.0],
    ]
    rng = np.random.default_rng(7)
    assert np.array_equal(bootstrap_resamples(5, n_boot=3, seed=7), [rng.integers(0, 5, 5) for _ in range(3)])

    x = np.array([0.1, 0.4, 0.4, 0.9, 0.2, 0.7, 0.7, 0.7, 0.3, 0.5, 0.8, 0.6])  # ties on both sides
    y = np.array([1.0, 2.0, 2.0, 5.0, 1.0, 3.0, 4.0, 4.0, 2.0, 3.0, 6.0, 3.0])
    rare = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # most resamples of 6 miss the 1: a constant side, NaN, dropped
    for a, b in ((x, y), (rare, np.arange(6.0)), (y, x[::-1])):
        loop = bootstrap_interval(lambda idx, a=a, b=b: spearman(a[idx], b[idx]), len(a), n_boot=400, seed=3)
        assert spearman_interval(a, b, n_boot=400, seed=3) == pytest.approx(loop, abs=1e-12)
    assert spearman_interval(x, y, n_boot=400, seed=3)[0] > 0.5  # strongly and positively related
    assert all(math.isnan(v) for v in spearman_interval([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]))
    assert all(math.isnan(v) for v in spearman_interval([1.0, float("nan")], [1.0, 2.0]))


def test_bootstrap_intervals_are_the_separate_intervals_from_one_pass():
    """Several numbers from one resample each: every interval is what bootstrap_interval gives for that number
    alone with the same seed, NaN resamples are dropped per number, and no items give NaN intervals."""
    import numpy as np

    from promptopt.metrics.stats import bootstrap_interval, bootstrap_intervals

    x = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    y = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])

    def ratio(idx):  # NaN on resamples where y has no 1s
        return x[idx].sum() / y[idx].sum() if y[idx].sum() else float("nan")

    calls = []

    def both(idx):
        calls.append(ratio(idx) != ratio(idx))
        return [x[idx].mean() - y[idx].mean(), ratio(idx)]

    together = bootstrap_intervals(both, len(x), names=("delta", "ratio"), n_boot=300, seed=4)
    assert len(calls) == 300 and 0 < sum(calls) < 300  # some resamples have no 1 in y: NaN ratios, dropped
    assert together["delta"] == bootstrap_interval(
        lambda idx: x[idx].mean() - y[idx].mean(), len(x), n_boot=300, seed=4
    )
    assert together["ratio"] == bootstrap_interval(ratio, len(x), n_boot=300, seed=4)
    assert together["delta"] != together["ratio"]
    assert all(v != v for v in bootstrap_intervals(both, 0, names=("delta", "ratio"))["ratio"])


def test_clustered_auroc_interval_is_the_loop_over_clusters_bit_for_bit(monkeypatch):
    """Resampling items, each with all its answers, every resample at once: the interval equals
    `bootstrap_interval` over items whose statistic ranks the concatenated answers, with clusters of 1-4 answers,
    tied scores across clusters, a NaN and infinite scores, resamples without a positive, and resample blocks
    split (the block size made small so that several blocks and a partial last one run)."""
    from promptopt.metrics.stats import auroc, bootstrap_resamples, clustered_auroc_interval, roc

    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 5, 23)
    cluster = np.repeat(np.arange(23), sizes)
    rng.shuffle(cluster)  # a cluster's answers need not be adjacent
    scores = rng.integers(0, 6, len(cluster)).astype(float) / 4  # many ties
    scores[[0, 7]], scores[3], scores[11] = np.inf, -np.inf, np.nan
    members = [np.flatnonzero(cluster == c) for c in range(23)]
    labels = np.zeros(len(cluster), dtype=bool)
    labels[[members[2][0], members[9][-1], members[17][0]]] = True  # 3 clusters: ~1 resample in 12 has none

    def statistic(idx):
        rows = np.concatenate([members[c] for c in idx])
        return auroc(scores[rows], labels[rows])

    loop = bootstrap_interval(statistic, 23, n_boot=400, seed=3)
    values = [statistic(idx) for idx in bootstrap_resamples(23, n_boot=400, seed=3)]
    assert any(math.isnan(v) for v in values) and loop[0] < loop[1]  # some resamples have no positive
    assert clustered_auroc_interval(scores, labels, cluster, n_boot=400, seed=3) == loop
    monkeypatch.setattr(roc, "_AUROC_BLOCK", 7 * len(cluster))  # blocks of 7 resamples, the last of 1
    assert clustered_auroc_interval(scores, labels, cluster, n_boot=400, seed=3) == loop
    assert all(math.isnan(v) for v in clustered_auroc_interval(scores, np.zeros(len(cluster), dtype=bool), cluster))
    assert all(math.isnan(v) for v in clustered_auroc_interval(np.full(4, np.nan), labels[:4], np.arange(4)))


def test_format_spread_interval_is_the_loop_bit_for_bit():
    from promptopt.metrics.stats import format_spread

    rng = np.random.default_rng(9)
    correct = (rng.random((57, 4)) < [0.3, 0.5, 0.6, 0.8]).astype(float)
    loop = bootstrap_interval(lambda idx: float(np.ptp(correct[idx].mean(axis=0))), 57, n_boot=300, seed=4)
    assert format_spread(correct, n_boot=300, seed=4)["ci95"] == list(loop) and loop[0] < loop[1]


def test_median_interval_against_hand_values():
    from promptopt.metrics.stats import median_interval

    # n = 5: P(Bin(5, ½) < 1) = 1/32, so [x(1), x(5)] covers 1 − 2/32 = 0.9375; k = 2 would cover 1 − 12/32
    assert median_interval([0.9, 0.7, 1.0, 0.8, 0.85]) == (0.7, 1.0, 0.9375)
    # n = 15: P(Bin < 4) = (1 + 15 + 105 + 455) / 32768 = 576/32768 -> coverage 0.96484375; P(Bin < 5) adds 1365:
    # 1 − 2·1941/32768 = 0.8815 < 0.95, so k = 4: the 4th and the 12th smallest
    values = [80 + i for i in range(15)][::-1]
    low, high, coverage = median_interval(values)
    assert (low, high) == (83, 91) and coverage == 1 - 2 * 576 / 32768
    assert median_interval([0.5]) == (0.5, 0.5, 0.0) and all(math.isnan(v) for v in median_interval([]))
