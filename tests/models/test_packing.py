"""An item's context run once for all its choices (promptopt/models/packing.py) must be invisible in the numbers:
every request's per-token log-probs, greedy flag, hidden state at the critical position and δ_TCB equal one plain,
unpadded, uncached forward of its own full prompt, within float noise; where packing is not exact (a sliding-window
layer) or does not pay (a few-shot prefix that is most of every prompt) the runner scores as before."""

from __future__ import annotations

import pytest

from promptopt.models import Runner
from tests.models.test_prefix_cache import tiny_gemma3  # noqa: F401  (a fixture: a Gemma-3 with a sliding-window layer)
from tests.models.test_runner_floor import _assert_matches_plain_forward, _plain

# 0-shot, HellaSwag-like: a context and four multi-token endings each (lm-eval's encoding: the continuation is what
# the full text adds to the context's ids)
CONTEXTS = [
    "Roof shingle removal: A man is sitting on a roof. He",
    "Clean and jerk: A lady walks to a barbell. She bends down and grabs the pole. The lady",
    "Canoeing: Two women in a child are shown in a canoe while a man pulls the canoe while standing in the water,"
    " with other individuals visible in the background. The child and a different man",
]
ENDINGS = [
    " is using wrap to wrap a pair of skis.",
    " starts pulling up roofing on a roof.",
    " swings and lands in his arms.",
    " is holding a rubik's cube.",
]


def _mc_requests(tok, contexts=CONTEXTS, endings=ENDINGS, shots=""):
    requests, groups = [], []
    for item, context in enumerate(contexts):
        ctx = tok(shots + context)["input_ids"]
        for ending in endings:
            requests.append((ctx, tok(shots + context + ending)["input_ids"][len(ctx) :]))
            groups.append(item)
    return requests, groups


def _partial_requests(tok):
    """Winogrande-like: the choices are contexts (the sentence up to the blank, each option filled in), one shared
    continuation after each."""
    sentences = [
        ("Sarah was a much better surgeon than Maria so ", ["Sarah", "Maria"], " always got the easier cases."),
        (
            "Ian volunteered to eat Dennis's menudo after already having a bowl because ",
            ["Ian", "Dennis"],
            " liked it.",
        ),
    ]
    requests, groups = [], []
    for item, (head, options, tail) in enumerate(sentences):
        for option in options:
            ctx = tok(head + option)["input_ids"]
            requests.append((ctx, tok(head + option + tail)["input_ids"][len(ctx) :]))
            groups.append(item)
    return requests, groups


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_packed_choices_give_the_plain_forward(tiny_lm, batch_size):
    requests, groups = _mc_requests(tiny_lm.tokenizer)
    runner = Runner(tiny_lm, batch_size=batch_size)
    results = runner.loglikelihood(requests, groups=groups)
    assert runner.last_call_packed
    _assert_matches_plain_forward(tiny_lm, requests, results, atol=1e-5)


def test_packing_groups_by_context_without_groups(tiny_lm):
    requests, _ = _mc_requests(tiny_lm.tokenizer)
    runner = Runner(tiny_lm)
    results = runner.loglikelihood(requests)
    assert runner.last_call_packed
    _assert_matches_plain_forward(tiny_lm, requests, results, atol=1e-5)


def test_partial_contexts_share_what_precedes_the_blank(tiny_lm):
    """Contexts that differ after a common head (the choices are contexts) pack on that head, exactly."""
    requests, groups = _partial_requests(tiny_lm.tokenizer)
    runner = Runner(tiny_lm)
    results = runner.loglikelihood(requests, groups=groups)
    assert runner.last_call_packed
    _assert_matches_plain_forward(tiny_lm, requests, results, atol=1e-5)


def test_tcb_targets_and_shared_critical_states(tiny_lm):
    """δ_TCB asked per request: requests of one item read one critical state (projected once) and get the plain
    forward's δ_TCB; a target that differs per request gets its own."""
    requests, groups = _mc_requests(tiny_lm.tokenizer)
    targets = [cont[0] for _, cont in requests]
    packed = Runner(tiny_lm).loglikelihood(requests, groups=groups, tcb_targets=targets)
    reference = Runner(tiny_lm)
    reference.use_prefix_cache = False  # whole inputs, no prefix, no packing
    plain = reference.loglikelihood(requests, tcb_targets=targets)
    assert not reference.last_call_packed
    for a, b in zip(packed, plain):
        assert a.tcb["tcb"] == pytest.approx(b.tcb["tcb"], rel=1e-4)
        assert a.tcb["nll"] == pytest.approx(b.tcb["nll"], abs=1e-5)


def test_a_short_prefix_and_packing_together(tiny_lm):
    """A few shared tokens before every context (a template's lead-in) are the prefix cache's; the items' own
    contexts, longer, are packed on top of it."""
    requests, groups = _mc_requests(tiny_lm.tokenizer, shots="Complete the story.\n")
    runner = Runner(tiny_lm, batch_size=3)
    results = runner.loglikelihood(requests, groups=groups)
    assert runner.last_call_packed and len(runner._prefixes) == 1
    _assert_matches_plain_forward(tiny_lm, requests, results, atol=1e-5)


def test_one_token_continuations_and_duplicate_inputs(tiny_lm):
    """Single-token choices (the input is the context itself for all of them) and an item repeated verbatim."""
    tok = tiny_lm.tokenizer
    requests, groups = [], []
    for item, context in enumerate([CONTEXTS[0], CONTEXTS[1], CONTEXTS[0]]):
        ctx = tok(context)["input_ids"]
        for word in (" yes", " no", " maybe is a longer one"):
            requests.append((ctx, tok(context + word)["input_ids"][len(ctx) :]))
            groups.append(item)
    runner = Runner(tiny_lm, batch_size=2)
    results = runner.loglikelihood(requests, groups=groups)
    assert runner.last_call_packed
    _assert_matches_plain_forward(tiny_lm, requests, results, atol=1e-5)


def test_a_long_few_shot_prefix_keeps_the_unpacked_batches(tiny_lm):
    """SST-2 style: the exemplar block is most of every prompt, so the prefix cache does the work and the batches
    stay as bench/bench_scoring.py measures them."""
    from tests.models.test_runner_floor import _requests

    runner = Runner(tiny_lm, batch_size=3)
    runner.loglikelihood(_requests(tiny_lm.tokenizer))
    assert not runner.last_call_packed


def test_packing_can_be_turned_off_and_gives_the_same_numbers(tiny_lm):
    requests, groups = _mc_requests(tiny_lm.tokenizer)
    on, off = Runner(tiny_lm), Runner(tiny_lm)
    off.share_item_contexts = False
    a, b = on.loglikelihood(requests, groups=groups), off.loglikelihood(requests, groups=groups)
    assert on.last_call_packed and not off.last_call_packed
    for x, y in zip(a, b):
        assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=1e-5) and x.is_greedy == y.is_greedy


def test_the_packed_mask_hides_other_tails(tiny_lm):
    """The check itself can fail: the same packed row under a plain causal mask (every tail seeing the ones before
    it) gives other log-probs for the second and later choices."""
    from promptopt.models import packing

    requests, groups = _mc_requests(tiny_lm.tokenizer)
    real = packing._mask
    packing._mask = lambda segment, prefix_len: real(segment.clamp(max=0), prefix_len)  # one segment: plain causal
    try:
        leaky = Runner(tiny_lm).loglikelihood(requests, groups=groups)
    finally:
        packing._mask = real
    first, second = (_plain(tiny_lm, *requests[i])[0] for i in (0, 1))
    assert leaky[0].token_logprobs == pytest.approx(first, abs=1e-5)
    assert leaky[1].token_logprobs != pytest.approx(second, abs=1e-3)


def test_a_sliding_window_model_is_not_packed(request):
    """Gemma-3's sliding-window layers would need their own mask: the runner scores whole inputs there."""
    lm = request.getfixturevalue("tiny_gemma3")
    requests, groups = _mc_requests(lm.tokenizer)
    runner = Runner(lm)
    results = runner.loglikelihood(requests, groups=groups)
    assert not runner.last_call_packed
    _assert_matches_plain_forward(lm, requests, results, atol=1e-5)


@pytest.mark.slow
@pytest.mark.long
def test_packed_choices_on_smollm2(embedded_lm):
    """The embedded model (30 layers): within the float noise the plain forward itself shows (tests/models/test_runner_floor.py)."""
    requests, groups = _mc_requests(embedded_lm.tokenizer)
    partial, partial_groups = _partial_requests(embedded_lm.tokenizer)
    runner = Runner(embedded_lm, batch_size=4)
    for reqs, grps in ((requests, groups), (partial, partial_groups)):
        results = runner.loglikelihood(reqs, groups=grps)
        assert runner.last_call_packed
        _assert_matches_plain_forward(embedded_lm, reqs, results, atol=5e-5)
