"""The scan's statistics against hand computations, its verdicts on constructed samples, and its sizing (issue 57:
say early whether searching can pay, read against the interval, not the point alone)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from promptopt.metrics.stats.selection import dev_items_for, minimum_detectable_effect
from promptopt.study.scan import analyse, scan_size, shrunk_accuracies, space_sd


def test_space_sd_by_hand():
    # two prompts, one right everywhere, one nowhere: MS_prompt = 4·(0.25 + 0.25)/1 = 2, no residual: σ² = 2/4
    assert space_sd([[1, 1, 1, 1], [0, 0, 0, 0]]) == pytest.approx(math.sqrt(0.5))
    # MS_prompt = 4·(2·(1/12)² + (1/6)²)/2 = 1/12 below MS_residual = (7/6)/6 = 7/36: no spread beyond item noise
    assert space_sd([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]]) == 0.0
    assert math.isnan(space_sd([[1, 0, 1]]))


def test_shrunk_accuracies_by_hand():
    # no residual: nothing to shrink
    assert shrunk_accuracies([[1, 1, 1, 1], [0, 0, 0, 0]], math.sqrt(0.5)).tolist() == [1.0, 0.0]
    # MS_residual 7/36 on 4 items: weight σ² / (σ² + 7/144) = 36/43 at σ = 0.5; σ = 0 puts every prompt at the mean
    matrix, mean = [[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]], 7 / 12
    expected = [mean + 36 / 43 * (a - mean) for a in (0.5, 0.5, 0.75)]
    assert shrunk_accuracies(matrix, 0.5) == pytest.approx(expected)
    assert shrunk_accuracies(matrix, 0.0) == pytest.approx([mean] * 3)


@pytest.mark.parametrize(
    ("trials", "dev", "minibatch", "expected"),
    [
        (10, 60, 16, (5, 16)),  # 32 items would cost 5·16 = 80 pairs beyond a first minibatch, over 0.1·10·60
        (12, 80, 16, (6, 32)),  # 6·16 = 96 = 0.1·12·80: the second slice fits
        (40, 200, 16, (8, 64)),  # 8·48 = 384 fits 800; 8·112 = 896 does not
        (4, 40, 16, (4, 16)),
        (2, 40, 16, (2, 16)),  # never more prompts than trials: they become the trials
        (10, 10, 16, (5, 10)),  # dev shorter than a minibatch
    ],
)
def test_scan_size(trials, dev, minibatch, expected):
    assert scan_size(trials, dev, minibatch) == expected


def _nested(rights: list[int], n: int) -> np.ndarray:
    """Prompt k right on its first rights[k] items of n: nested rows, so item noise is small against the spread."""
    return np.array([[i < r for i in range(n)] for r in rights])


def test_search_when_the_expected_gain_reaches_what_dev_detects():
    # one prompt right on all 40 items, three on the first 20 as the incumbent: σ² = (2.5 − 7.5/117)/40
    matrix, incumbent = _nested([40, 20, 20, 20], 40), _nested([20], 40)[0]
    result = analyse(matrix, incumbent, dev_items=40)
    sd = math.sqrt((2.5 - 7.5 / 117) / 40)
    assert result.space_sd == pytest.approx(sd)
    weight = sd**2 / (sd**2 + 7.5 / 117 / 40)
    assert result.headroom == pytest.approx(0.625 + weight * 0.375 - 0.5)  # the best prompt, shrunk, over 0.5
    # every sampled prompt is at least as accurate as the incumbent: discordance (20 + 0 + 0 + 0) / 4 / 40
    assert result.mde == pytest.approx(minimum_detectable_effect(40, 0.125))
    assert result.verdict == "search" and result.why.startswith("the space moves dev accuracy")
    assert result.spread == 0.5 and result.pairs == 160


def test_the_detectable_difference_reads_the_prompts_that_could_replace_the_incumbent():
    # two prompts above the incumbent (right on its 20 items and 4 more), two far below it (right on 4): the MDE is
    # the contenders' discordance with the incumbent, 4/40, not the sample's, (4 + 4 + 16 + 16)/4/40
    matrix, incumbent = _nested([24, 24, 4, 4], 40), _nested([20], 40)[0]
    result = analyse(matrix, incumbent, dev_items=40)
    assert result.mde == pytest.approx(minimum_detectable_effect(40, 0.1))


def test_keep_the_incumbent_when_even_the_top_of_the_interval_gains_nothing():
    matrix, incumbent = _nested([24, 22, 20, 18], 40), np.ones(40, dtype=bool)
    result = analyse(matrix, incumbent, dev_items=40)
    assert result.headroom_high <= 0 and result.verdict == "keep the incumbent"


def test_add_dev_items_when_the_gain_is_below_what_dev_detects():
    # nested rows 200, 208, 216, 224 of 400 right: the best is about +0.04, but 50 dev items detect ≈ 0.056
    matrix, incumbent = _nested([200, 208, 216, 224], 400), _nested([208], 400)[0]
    result = analyse(matrix, incumbent, dev_items=50)
    assert 0 < result.headroom < result.mde and result.verdict == "add dev items"
    # the contenders (208, 216, 224 right) disagree with the incumbent on (0 + 8 + 16) / 3 of 400 items
    assert result.dev_items_needed == dev_items_for(result.headroom, 0.02)


def test_alike_prompts_a_little_above_the_incumbent_are_a_gain_to_add_dev_items_for():
    # four identical prompts, 10 items of 400 above the incumbent: σ = 0 in every resample, so every prompt is at
    # the mean, 0.025 above the incumbent: below what 50 dev items detect
    matrix, incumbent = _nested([210] * 4, 400), _nested([200], 400)[0]
    result = analyse(matrix, incumbent, dev_items=50)
    assert result.space_sd_ci95 == (0.0, 0.0)
    assert result.headroom == pytest.approx(0.025) == result.headroom_high
    assert result.mde == pytest.approx(minimum_detectable_effect(50, 0.025))
    assert result.verdict == "add dev items"


def test_widen_the_space_when_the_sample_does_not_beat_the_incumbent_but_its_interval_might():
    """A noisy 16-item slice (seeded): σ's point estimate is 0, so every prompt is at the sample's mean, below the
    incumbent; at the top of σ's interval the best of 10 would pass it."""
    rng = np.random.default_rng(6)
    matrix, incumbent = rng.random((4, 16)) < 0.5, rng.random(16) < 0.6
    result = analyse(matrix, incumbent, dev_items=60)
    assert result.space_sd == 0.0 and result.headroom == pytest.approx(matrix.mean() - incumbent.mean())
    assert result.headroom <= 0 < result.headroom_high and result.verdict == "widen the space"


def test_a_sample_that_answers_as_the_incumbent_does_is_no_reason_to_search():
    # no gain and no discordance (an MDE of 0): not `search` (a model that gives one label to everything)
    incumbent = _nested([20], 40)[0]
    result = analyse([incumbent] * 4, incumbent, dev_items=40)
    assert result.headroom == 0 and result.mde == 0 and result.verdict == "keep the incumbent"
    assert "every sampled prompt answered the 40 items as the incumbent did" in result.why
    different = analyse([[not v for v in incumbent]] * 2 + [incumbent] * 2, incumbent, dev_items=40)
    assert "cannot tell them apart" not in different.why  # only where no item differs
