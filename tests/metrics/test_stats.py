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
    from promptopt.metrics.stats import auroc, auroc_interval, performance_drop_rate
    from promptopt.report.families import _pdr_interval

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


def test_clustered_paired_exact_by_hand():
    """Two seeds, three items: per-item differences (in right answers over the seeds) 2, 1, 1. The 2^3 sign flips
    give sums ±4, ±2, ±2, 0, 0 ... : 4, 2, 2, 0, 0, −2, −2, −4, so P(|T| ≥ 4) = 2/8."""
    from promptopt.metrics.stats.binomial import clustered_paired_exact

    a = np.array([[1, 1, 0, 1], [1, 0, 1, 1]], dtype=bool)  # item 3 right by both: no difference
    b = np.array([[0, 0, 0, 1], [0, 0, 0, 1]], dtype=bool)
    assert clustered_paired_exact(a, b) == (4, 0, pytest.approx(2 / 8))
    # differences 2, −1, 1 (sum 2): sums 2 ±1 ∓1 ... over 8 flips are 4, 2, 2, 0, 0, −2, −2, −4: P(|T| ≥ 2) = 6/8
    b2 = np.array([[0, 1, 0, 1], [0, 1, 0, 1]], dtype=bool)
    assert clustered_paired_exact(a, b2) == (3, 1, pytest.approx(6 / 8))
    assert clustered_paired_exact(a, a) == (0, 0, 1.0)


def test_clustered_paired_exact_is_mcnemar_per_item_and_counts_an_item_once():
    """With one seed it is McNemar's exact test; a baseline's one set of answers repeated for each seed (as
    compare pairs it with two searches) is no new evidence: the p stays the one-seed p, where McNemar over the
    300 pooled (seed, item) pairs halves it and more. Brute force over every sign flip for a small case."""
    import itertools

    from promptopt.metrics.stats.binomial import clustered_paired_exact

    rng = np.random.default_rng(3)
    a, b = rng.random(150) < 0.72, rng.random(150) < 0.62
    one = clustered_paired_exact(a[None], b[None])
    assert one == mcnemar_exact(a, b)
    twice = clustered_paired_exact(np.stack([a, a]), np.stack([b, b]))
    assert twice[2] == pytest.approx(one[2], rel=1e-12)
    assert mcnemar_exact(np.concatenate([a, a]), np.concatenate([b, b]))[2] < one[2] / 2  # the pooled count's error
    s2 = rng.random((3, 9)) < 0.6
    s1 = rng.random((3, 9)) < 0.4
    d = s2.sum(0).astype(int) - s1.sum(0).astype(int)
    sums = [abs(sum(f * x for f, x in zip(flips, d))) for flips in itertools.product((1, -1), repeat=len(d))]
    brute = sum(t >= abs(d.sum()) for t in sums) / len(sums)
    assert clustered_paired_exact(s2, s1)[2] == pytest.approx(brute, rel=1e-12)


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


# --- the numbers scipy now computes: hand values, and promptopt's own pre-scipy outputs pinned ------------------------
# Pinned: what promptopt's own implementation (exact integer binomial tail, np.corrcoef, Fisher z from r and n) printed
# on these inputs before scipy took over, as repr. The scipy values must agree to 1e-12 relative (they differ in the
# last bits only) and to every digit the CLI and the report print (p: .3g; correlations and their intervals: .3f).
PINNED_MCNEMAR = {  # (only a correct, only b correct) -> p
    (5, 1): 0.21875,
    (7, 3): 0.34375,
    (3, 3): 1.0,
    (20, 8): 0.03569813817739487,
    (1, 0): 1.0,
    (12, 2): 0.012939453125,
    (130, 95): 0.023197506839685356,
    (0, 17): 1.52587890625e-05,
    (40, 41): 1.0,
}
X12 = [0.1, 0.4, 0.4, 0.9, 0.2, 0.7, 0.7, 0.7, 0.3, 0.5, 0.8, 0.6]  # ties on both sides
Y12 = [1.0, 2.0, 2.0, 5.0, 1.0, 3.0, 4.0, 4.0, 2.0, 3.0, 6.0, 3.0]
U30 = [-1.232, 0.267, -0.007, 0.502, -1.327, 1.108, 0.094, -1.171, -1.358, -1.307, -0.718, 1.186, 0.895, -0.544, -0.547]
U30 += [1.93, 0.903, -0.803, -0.15, -0.43, 0.152, 0.879, -0.275, 0.369, 0.568, 0.784, -0.63, -0.222, 1.972, -0.186]
V30 = [-0.586, 0.574, -0.581, -0.139, 1.015, 1.85, -1.056, -0.52, -1.968, -2.185, -0.356, 2.118, 0.366, 1.198, -1.33]
V30 += [1.101, 0.532, -0.315, 0.918, 0.358, -0.473, -0.912, -0.691, 0.164, -0.267, -1.133, -2.079, 0.7, 1.242, -0.679]
PINNED_CORRELATIONS = {  # name -> (x, y, pearson, spearman, pearson 95% interval, spearman 95% interval)
    "ties": (
        X12,
        Y12,
        0.9258200997725516,
        0.9659276076259363,
        (0.7508870243318987, 0.9793591566066309),
        (0.8444393213020417, 0.9929022490908274),
    ),
    "noisy": (
        U30,
        V30,
        0.5207517323267024,
        0.48654060066740823,
        (0.19754387925367992, 0.7418431516216175),
        (0.13185213109314156, 0.7307857915827771),
    ),
    "small": (
        [1, 2, 3, 4, 5],
        [2, 1, 4, 3, 6],
        0.8219949365267863,
        0.7999999999999999,
        (-0.21934335747078146, 0.987852453504985),
        (-0.4571243888052962, 0.9908429478778042),
    ),
}


def _paired(only_a: int, only_b: int, both: int = 3, neither: int = 2):
    a = [True] * only_a + [False] * only_b + [True] * both + [False] * neither
    b = [False] * only_a + [True] * only_b + [True] * both + [False] * neither
    return a, b


def _same_printed(got: float, pinned: float, fmt: str) -> bool:
    return format(got, fmt) == format(pinned, fmt) and got == pytest.approx(pinned, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("counts", list(PINNED_MCNEMAR))
def test_mcnemar_is_todays_number_and_the_exact_binomial_tail(counts):
    only_a, only_b = counts
    n, low = only_a + only_b, min(counts)
    by_hand = min(1.0, 2 * sum(math.comb(n, k) for k in range(low + 1)) / 2**n) if n else 1.0
    got = mcnemar_exact(*_paired(only_a, only_b))
    assert got[:2] == counts
    assert _same_printed(got[2], PINNED_MCNEMAR[counts], ".3g") and got[2] == pytest.approx(by_hand, rel=1e-12)


def test_mcnemar_hand_values():
    # discordant 5 vs 1: 2 · (C(6,0) + C(6,1)) / 2^6 = 14/64; 7 vs 3: 2 · (1 + 10 + 45 + 120) / 2^10 = 352/1024
    assert mcnemar_exact(*_paired(5, 1))[2] == pytest.approx(14 / 64, rel=1e-14)
    assert mcnemar_exact(*_paired(7, 3))[2] == pytest.approx(352 / 1024, rel=1e-14)
    assert mcnemar_exact(*_paired(0, 17))[2] == pytest.approx(2 / 2**17, rel=1e-14)  # all discordant one way
    assert mcnemar_exact(*_paired(40, 41))[2] == 1.0 and mcnemar_exact(*_paired(3, 3))[2] == 1.0  # a split at n/2
    assert mcnemar_exact(*_paired(0, 0))[2] == 1.0  # no discordant pair


@pytest.mark.parametrize("name", list(PINNED_CORRELATIONS))
def test_correlations_are_todays_numbers(name):
    from promptopt.metrics.stats import correlation_interval, pearson, pearson_interval, spearman

    x, y, r, rho, r_ci, rho_ci = PINNED_CORRELATIONS[name]
    assert _same_printed(pearson(x, y), r, ".3f") and _same_printed(spearman(x, y), rho, ".3f")
    for got, pinned in zip(pearson_interval(x, y), r_ci):
        assert _same_printed(got, pinned, ".3f")
    for got, pinned in zip(correlation_interval(spearman(x, y), len(x), method="spearman"), rho_ci):
        assert _same_printed(got, pinned, ".3f")


def test_correlations_by_hand():
    from promptopt.metrics.stats import pearson, pearson_interval, spearman

    # x = 1..5, y = 2,1,4,3,6: deviations (−2,−1,0,1,2) and (−1.2,−2.2,0.8,−0.2,2.8): Σdxdy = 10, Σdx² = 10,
    # Σdy² = 14.8 -> r = 10/√148; ranks of y 2,1,4,3,5: Σd² = 4 -> ρ = 1 − 6·4/(5·24) = 0.8
    x, y = [1, 2, 3, 4, 5], [2, 1, 4, 3, 6]
    r = 10 / math.sqrt(148)
    assert pearson(x, y) == pytest.approx(r, rel=1e-14) and spearman(x, y) == pytest.approx(0.8, rel=1e-14)
    z, half = math.atanh(r), 1.959963984540054 / math.sqrt(5 - 3)  # Fisher z: atanh r ± z_0.975 / √(n − 3)
    assert pearson_interval(x, y) == pytest.approx((math.tanh(z - half), math.tanh(z + half)), rel=1e-12)


def test_correlations_keep_their_nan_rules():
    from promptopt.metrics.stats import pearson, pearson_interval, spearman

    nan = float("nan")
    for f in (pearson, spearman):
        assert math.isnan(f([1, 1, 1], [1, 2, 3])) and math.isnan(f([1, 2, 3], [4, 4, 4]))  # a constant side
        assert math.isnan(f([1.0], [2.0])) and math.isnan(f([1, 2, nan], [1, 2, 3]))  # one pair; a NaN
    assert math.isnan(pearson([1, 2, float("inf")], [1, 2, 3]))  # as np.corrcoef gave
    assert spearman([1, 2, float("inf")], [1, 2, 3]) == pytest.approx(1.0)  # ranks: +inf is the largest
    assert all(math.isnan(v) for v in pearson_interval([1, 2, 3], [1, 3, 2]))  # n ≤ 3: no Fisher-z interval
    assert all(math.isnan(v) for v in pearson_interval([1, 1, 1, 1], [1, 2, 3, 4]))
    assert pearson([1, 2], [2, 1]) == pytest.approx(-1.0)


def test_auroc_is_the_rank_sum_formula_bit_for_bit():
    """scipy's Mann–Whitney U over n_pos · n_neg is what promptopt computed from its own average ranks before,
    to the last bit (ranks are halves, their sums exact), ties and left-out non-finite scores included."""
    from promptopt.metrics.stats import auroc, average_ranks

    rng = np.random.default_rng(12)
    for _ in range(300):
        n = int(rng.integers(2, 120))
        scores = rng.integers(0, int(rng.integers(2, 30)), n) / 7  # many ties
        scores[rng.random(n) < 0.05] = np.inf
        labels = rng.random(n) < rng.uniform(0.1, 0.9)
        keep = np.isfinite(scores)
        s, lab = scores[keep], labels[keep]
        n_pos, n_neg = int(lab.sum()), int((~lab).sum())
        if not n_pos or not n_neg:
            assert math.isnan(auroc(scores, labels))
            continue
        by_ranks = float((average_ranks(s)[lab].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
        assert auroc(scores, labels) == by_ranks
