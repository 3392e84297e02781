"""Scoring at the forward-pass floor must be invisible in the numbers: prefix-cached, batched, right-padded
scoring gives, item by item, what one plain full-prompt forward gives (log-probs, greedy flags, the hidden
state at the critical position, δ_TCB), and the CPU attention path gives transformers' sdpa numbers bit for bit."""

from __future__ import annotations

import pytest
import torch

from promptopt.models import Runner
from promptopt.models.runner import _GROUPED_SDPA

SHOTS = "Review: great fun.\nSentiment: positive\n\nReview: a dull mess.\nSentiment: negative\n\n"
REVIEWS = [
    "superb",
    "it is charming and often affecting",
    "bleak and desperate film, and far too long for what it says",
    "dull",
]
CONTINUATIONS = [" negative", " positive", " rather good, I think"]


def _requests(tok, shots=SHOTS):
    """(context, continuation) ids as the scorer builds them: the continuation is what the full text adds."""
    requests = []
    for review in REVIEWS:
        text = shots + f"Review: {review}\nSentiment:"
        ctx = tok(text)["input_ids"]
        for cont in CONTINUATIONS:
            requests.append((ctx, tok(text + cont)["input_ids"][len(ctx) :]))
    return requests


def _plain(lm, ctx, cont):
    """One unpadded, uncached forward of the whole prompt: per-token log p (float64 softmax of the model's own
    logits), whether each token was the argmax, and the final hidden state that predicts the first token."""
    ids = torch.tensor([ctx + cont])
    with torch.inference_mode():
        logits = lm.model(input_ids=ids).logits[0, len(ctx) - 1 : -1]
        hidden = lm.base(input_ids=ids).last_hidden_state[0, len(ctx) - 1]
    logp = torch.log_softmax(logits.double(), -1)
    return (
        [float(logp[i, t]) for i, t in enumerate(cont)],
        bool((logits.argmax(-1) == torch.tensor(cont)).all()),
        hidden,
    )


def _assert_matches_plain_forward(lm, requests, results, atol):
    critical = []
    for (ctx, cont), res in zip(requests, results):
        logprobs, greedy, hidden = _plain(lm, ctx, cont)
        assert res.token_logprobs == pytest.approx(logprobs, abs=atol)
        assert res.is_greedy == greedy
        assert torch.allclose(res.hidden, hidden.float(), atol=atol, rtol=1e-6)
        critical.append(hidden.float())
    ours, plain = lm.output_head(torch.stack([r.hidden for r in results])), lm.output_head(torch.stack(critical))
    assert torch.allclose(ours.tcb, plain.tcb, rtol=1e-4, atol=0)


def _with_transformers_sdpa(lm, fn):
    """Run `fn` on transformers' own sdpa attention (the path before the grouped one), then switch back."""
    lm.model.set_attn_implementation("sdpa")
    try:
        return fn()
    finally:
        lm.model.set_attn_implementation(_GROUPED_SDPA)


def _check_runner(lm, atol):
    requests = _requests(lm.tokenizer)
    runner = Runner(lm, batch_size=3)  # batches of different padded widths, rows padded inside them
    assert lm.model.config._attn_implementation == _GROUPED_SDPA  # CPU, sdpa, grouped-query heads
    cached = runner.loglikelihood(requests)
    _assert_matches_plain_forward(lm, requests, cached, atol)

    before = _with_transformers_sdpa(lm, lambda: Runner(lm, batch_size=3).loglikelihood(requests))
    for a, b in zip(cached, before):  # bit for bit what the runner gave before the grouped attention
        assert a.token_logprobs == b.token_logprobs and a.is_greedy == b.is_greedy and torch.equal(a.hidden, b.hidden)

    runner.use_prefix_cache = False
    for a, b in zip(cached, runner.loglikelihood(requests)):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=atol) and a.is_greedy == b.is_greedy


def test_runner_matches_plain_forward_on_tiny_model(tiny_lm):
    _check_runner(tiny_lm, atol=1e-5)


def test_grouped_attention_is_transformers_sdpa_bit_for_bit(tiny_lm):
    """A left-padded batch (the generation layout, with a mask) through the whole model, both ways."""
    tok = tiny_lm.tokenizer
    rows = [tok(t)["input_ids"] for t in ("The capital of France is", "Once", "Question: what is 2+3?\nAnswer:")]
    width = max(map(len, rows))
    ids = torch.tensor([[2] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    Runner(tiny_lm)

    def logits():
        with torch.inference_mode():
            return tiny_lm.model(input_ids=ids, attention_mask=mask).logits

    assert torch.equal(logits(), _with_transformers_sdpa(tiny_lm, logits))


@pytest.mark.slow
@pytest.mark.long
def test_runner_matches_plain_forward_on_smollm2(embedded_lm):
    # float32 noise on this 30-layer model: one row of a plain forward moves its log-probs by up to 2.1e-5 nats
    # when 7 pad tokens follow it; the cached runner was measured within 2.8e-5, the uncached one 2.7e-5
    _check_runner(embedded_lm, atol=5e-5)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [5, 16])
def test_smollm2_scores_as_the_runner_did_before(embedded_lm, batch_size):
    """Reused prefix buffers give a copied prefix's numbers bit for bit; the last MLP where read gives the
    reference's within float rounding (measured: identical at batch 16; at batch 5 within 1.3e-6 in log p on an AMD
    EPYC, 1.05e-5 on a -12.1 log p on an Intel Xeon, the same code on either thread count: a tolerance of 3e-5,
    under the 5e-5 a plain forward moves by with padding, test_runner_matches_plain_forward_on_smollm2)."""
    from tests.models.test_prefix_cache import assert_buffers_match_copies, assert_matches_reference

    requests = _requests(embedded_lm.tokenizer)
    assert_buffers_match_copies(embedded_lm, requests, batch_size=batch_size)
    assert_matches_reference(embedded_lm, requests, batch_size=batch_size, atol=3e-5)


@pytest.mark.slow
@pytest.mark.long
def test_sst2_scores_match_plain_forward_per_item(embedded_lm):
    """The scorer's table (gold log-prob, prediction, δ_TCB at the critical state) against one plain forward of
    each item's full prompt per choice."""
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    task = load_task("sst2")
    prompt, items = task.default_prompt(), task.dev[:8]
    table = Scorer(embedded_lm, task, batch_size=3).score(prompt, items).table
    tok = embedded_lm.tokenizer
    critical = []
    for item, row in zip(items, table.itertuples()):
        context = prompt.context(item.question, item.choices, tok)
        ctx = tok(context)["input_ids"]
        plain = [
            _plain(embedded_lm, ctx, tok(context + " " + word)["input_ids"][len(ctx) :])
            for word in ("negative", "positive")
        ]
        scores = [sum(logprobs) for logprobs, _, _ in plain]
        assert row.gold_logprob == pytest.approx(scores[item.gold], abs=5e-5)  # float32 noise, as above
        assert row.pred == max(range(2), key=scores.__getitem__)
        critical.append(plain[0][2].float())
    plain_tcb = embedded_lm.output_head(torch.stack(critical)).tcb
    assert table["tcb"].to_numpy() == pytest.approx(plain_tcb.numpy(), rel=1e-4)


def test_tcb_read_from_the_log_probs_logits_is_the_heads_own(tiny_lm, monkeypatch):
    """δ_TCB asked of the runner (at each request's critical position, with its own target) comes from the logits
    its log-probs come from; it must be what the output head gives on the critical hidden states: with
    multi-token continuations (rows that are not critical), requests that share a critical row with different
    targets, and chunks of rows that split them."""
    import functools

    requests = _requests(tiny_lm.tokenizer)
    targets = [7 * i % 50 + (i % 3) for i in range(len(requests))]  # a context's choices: different targets
    runner = Runner(tiny_lm, batch_size=3)
    assert all(r.tcb is None for r in runner.loglikelihood(requests))
    with pytest.raises(ValueError, match="tcb_targets"):
        runner.loglikelihood(requests, tcb_targets=targets[:-1])
    for chunk in (256, 5):
        monkeypatch.setattr(runner, "_target_logprobs", functools.partial(Runner._target_logprobs, runner, chunk=chunk))
        results = runner.loglikelihood(requests, tcb_targets=targets, eps=0.5)
        head = tiny_lm.output_head(torch.stack([r.hidden for r in results]), eps=0.5, target=torch.tensor(targets))
        for name, values in head.to_dict().items():
            ours = torch.tensor([r.tcb[name] for r in results], dtype=values.dtype)
            if values.is_floating_point():
                assert torch.allclose(ours, values, rtol=1e-6, atol=0), (chunk, name)
            else:
                assert torch.equal(ours, values), (chunk, name)
        assert len({r.tcb["nll"] for r in results[:3]}) == 3  # one critical row, three targets
