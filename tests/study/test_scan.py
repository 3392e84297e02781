"""The scan's statistics against hand computations, its verdicts on constructed samples, and its sizing (issue 57:
say early whether searching can pay, read against the interval, not the point alone)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from promptopt.metrics.stats.selection import dev_items_for, minimum_detectable_effect
from promptopt.study.scan import analyse, expected_max_normal, scan_size, space_sd


def test_space_sd_by_hand():
    # two prompts, one right everywhere, one nowhere: MS_prompt = 4·(0.25 + 0.25)/1 = 2, no residual: σ² = 2/4
    assert space_sd([[1, 1, 1, 1], [0, 0, 0, 0]]) == pytest.approx(math.sqrt(0.5))
    # MS_prompt = 4·(2·(1/12)² + (1/6)²)/2 = 1/12 below MS_residual = (7/6)/6 = 7/36: no spread beyond item noise
    assert space_sd([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]]) == 0.0
    assert math.isnan(space_sd([[1, 0, 1]]))


def test_expected_max_normal_by_hand():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)


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
    result = analyse(matrix, incumbent, trials=10, dev_items=40)
    sd = math.sqrt((2.5 - 7.5 / 117) / 40)
    assert result.space_sd == pytest.approx(sd)
    assert result.headroom == pytest.approx(0.625 + sd * expected_max_normal(10) - 0.5)
    assert result.mde == pytest.approx(minimum_detectable_effect(40, 0.125))
    assert result.verdict == "search" and result.why.startswith("the space moves dev accuracy")
    assert result.spread == 0.5 and result.pairs == 160


def test_search_when_the_slice_cannot_rule_a_detectable_gain_out():
    """A 16-item slice of a noisy sample: the point estimate of σ is 0, but its interval reaches far enough that the
    best of 10 trials could beat the incumbent by what 60 dev items detect; an interval reaching 0 is no evidence
    that the space is flat (SST-2's first bench unit said `widen the space` here, where the space held a prompt
    +0.17 better on test)."""
    rng = np.random.default_rng(0)
    matrix, incumbent = rng.random((4, 16)) < 0.55, rng.random(16) < 0.55
    result = analyse(matrix, incumbent, trials=10, dev_items=60)
    assert result.space_sd == 0.0 and result.space_sd_ci95[0] == 0.0
    assert result.headroom < result.mde <= result.headroom_high
    assert result.verdict == "search" and result.why.startswith("the scan cannot rule out")
    # the same sample for a single trial: no best-of-T lift, nothing to search for
    assert analyse(matrix, incumbent, trials=1, dev_items=60).verdict != "search"


def test_keep_the_incumbent_when_even_the_top_of_the_interval_gains_nothing():
    matrix, incumbent = _nested([24, 22, 20, 18], 40), np.ones(40, dtype=bool)
    result = analyse(matrix, incumbent, trials=10, dev_items=40)
    assert result.headroom_high <= 0 and result.verdict == "keep the incumbent"


def test_add_dev_items_when_the_space_moves_but_dev_is_too_small():
    # nested rows 200, 208, 216, 224 of 400 right: σ is well above 0, but 50 dev items detect ≈ 0.056 only
    matrix, incumbent = _nested([200, 208, 216, 224], 400), _nested([208], 400)[0]
    result = analyse(matrix, incumbent, trials=3, dev_items=50)
    assert result.space_sd_ci95[0] > 0 and 0 < result.headroom < result.headroom_high < result.mde
    assert result.verdict == "add dev items"
    assert result.dev_items_needed == dev_items_for(result.headroom, 0.02)  # discordance (8 + 0 + 8 + 16)/4/400


def test_widen_the_space_when_its_prompts_are_alike():
    # four identical prompts, 10 items of 400 above the incumbent: σ = 0 in every resample, gain 0.025 < mde
    matrix, incumbent = _nested([210] * 4, 400), _nested([200], 400)[0]
    result = analyse(matrix, incumbent, trials=10, dev_items=50)
    assert result.space_sd_ci95 == (0.0, 0.0)
    assert result.headroom_high == pytest.approx(0.025)
    assert result.mde == pytest.approx(minimum_detectable_effect(50, 0.025))
    assert result.verdict == "widen the space"
