"""Where scoring batches are cut (models/length_batches.py): the least padded tokens plus forward costs over every
way of cutting the sorted inputs (checked against enumerating them all), fixed chunks without a forward cost, and
a runner cutting that way scores as one cutting fixed chunks (a first batch smaller than the next included)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from promptopt.models import Runner
from promptopt.models.length_batches import length_batches


def _cost(lengths, sizes, overhead):
    cost, at = 0.0, 0
    for size in sizes:
        cost += overhead + size * lengths[at]  # a batch is padded to its first (longest) input
        at += size
    return cost


def _every_cut(n, max_rows):
    """Every composition of n into parts of at most max_rows."""
    for bits in itertools.product((0, 1), repeat=n - 1):
        sizes, run = [], 1
        for bit in bits:
            if bit:
                sizes.append(run)
                run = 1
            else:
                run += 1
        sizes.append(run)
        if max(sizes) <= max_rows:
            yield sizes


def test_the_cuts_cost_least_among_all_cuts():
    rng = random.Random(0)
    for _ in range(60):
        n, max_rows = rng.randint(1, 10), rng.randint(1, 5)
        lengths = sorted((rng.randint(1, 60) for _ in range(n)), reverse=True)
        overhead = rng.choice([0.5, 8.0, 32.0, 200.0])
        sizes = length_batches(lengths, max_rows, overhead)
        assert sum(sizes) == n and max(sizes) <= max_rows
        best = min(_cost(lengths, cut, overhead) for cut in _every_cut(n, max_rows))
        assert _cost(lengths, sizes, overhead) == pytest.approx(best)


def test_by_hand():
    # one long input and eight short ones, four rows a batch, a forward worth 5 tokens: fixed chunks cost
    # (5 + 4*50) + (5 + 4*10) + (5 + 1*10) = 265; the long input alone, then 4 + 4: 55 + 45 + 45 = 145
    lengths = [50] + [10] * 8
    assert length_batches(lengths, 4, None) == [4, 4, 1]
    assert length_batches(lengths, 4, 5.0) == [1, 4, 4]
    assert sorted(length_batches([7] * 5, 4, 5.0)) == [1, 4]  # equal lengths: as few forwards as the rows allow
    assert length_batches([], 4, 5.0) == []
    with pytest.raises(ValueError, match="sorted"):
        length_batches([1, 2], 4, 5.0)


def test_a_runner_cutting_by_cost_scores_as_fixed_chunks(tiny_lm):
    """One long input then short ones: the first batch holds one row, the next ones more, on one prefix cache."""
    tok = tiny_lm.tokenizer
    shots = "Review: great fun.\nSentiment: positive\n\nReview: a dull mess.\nSentiment: negative\n\n"
    reviews = ["a " * 40 + "long one"] + [f"short {k}" for k in range(7)]
    requests = []
    for review in reviews:
        ctx = tok(shots + f"Review: {review}\nSentiment:")["input_ids"]
        requests.append((ctx, tok(" positive")["input_ids"]))
    by_cost, fixed = Runner(tiny_lm, batch_size=4), Runner(tiny_lm, batch_size=4)
    assert by_cost.forward_overhead_tokens is not None  # a CPU runner cuts by cost
    fixed.forward_overhead_tokens = None
    widths = sorted((len(c) + len(t) - 1 for c, t in requests), reverse=True)
    prefix = len(tok(shots + "Review:")["input_ids"]) - 1
    assert length_batches([w - prefix for w in widths], 4, by_cost.forward_overhead_tokens)[0] == 1
    for a, b in zip(by_cost.loglikelihood(requests), fixed.loglikelihood(requests)):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)
        assert torch.allclose(a.hidden, b.hidden, atol=1e-5)
