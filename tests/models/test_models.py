"""Model loading and the runner: prefix reuse must be invisible in the numbers."""

from __future__ import annotations

import pytest
import torch

from promptopt.errors import ModelNotFoundError, UnsupportedError
from promptopt.models import Runner, load_model
from promptopt.models.runner import common_prefix_length


def _uncached_logprobs(lm, ctx, cont):
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0
    assert common_prefix_length([]) == 0


def test_prefix_cached_scores_equal_uncached_forward(tiny_lm):
    tok = tiny_lm.tokenizer
    shots = "Review: great fun.\nSentiment: positive\n\nReview: a dull mess.\nSentiment: negative\n\n"
    requests = []
    for review in ["it is charming", "bleak and desperate film", "superb"]:
        ctx = tok(shots + f"Review: {review}\nSentiment:")["input_ids"]
        for cont in [" negative", " positive", " rather good, I think"]:
            whole = tok(shots + f"Review: {review}\nSentiment:" + cont)["input_ids"]
            requests.append((ctx, whole[len(ctx) :]))
    runner = Runner(tiny_lm, batch_size=4)
    cached = runner.loglikelihood(requests)
    assert len(runner._prefixes) == 1  # the shot block was run once
    for (ctx, cont), res in zip(requests, cached):
        expected = _uncached_logprobs(tiny_lm, ctx, cont)
        assert res.token_logprobs == pytest.approx(expected, abs=1e-4)
    runner.use_prefix_cache = False
    plain = runner.loglikelihood(requests)
    for a, b in zip(cached, plain):
        assert torch.allclose(a.hidden, b.hidden, atol=1e-4)


@pytest.mark.slow
def test_token_boundary_trap_on_smollm2(embedded_lm):
    """A block that ends in "\\n\\n" tokenizes differently alone and in context; the token-space prefix
    must give the full-prompt numbers, not the text-split ones."""
    tok = embedded_lm.tokenizer
    block = "Review: a gorgeous film.\nSentiment: positive\n\n"
    query = "Review: dull.\nSentiment:"  # block alone ends in "\n\n"; in context it is "\n", "\n"
    assert tok(block + query)["input_ids"][: len(tok(block)["input_ids"])] != tok(block)["input_ids"]
    ctx = tok(block + query)["input_ids"]
    cont = tok(block + query + " negative")["input_ids"][len(ctx) :]
    other = tok(block + "Review: fine.\nSentiment:")["input_ids"]
    other_cont = tok(block + "Review: fine.\nSentiment: positive")["input_ids"][len(other) :]
    res = Runner(embedded_lm).loglikelihood([(ctx, cont), (other, other_cont)])
    assert res[0].token_logprobs == pytest.approx(_uncached_logprobs(embedded_lm, ctx, cont), abs=1e-4)
    assert res[1].token_logprobs == pytest.approx(_uncached_logprobs(embedded_lm, other, other_cont), abs=1e-4)


def test_batched_generation_matches_single_and_hf_generate(tiny_lm):
    tok = tiny_lm.tokenizer
    prompts = ["Question: what is 2+3?\nAnswer:", "The capital of France is", "Once"]
    contexts = [tok(p)["input_ids"] for p in prompts]
    runner = Runner(tiny_lm, batch_size=3)
    batched = runner.generate(contexts, max_new_tokens=8)
    for ctx, got in zip(contexts, batched):
        single = Runner(tiny_lm, batch_size=1).generate([ctx], max_new_tokens=8)[0]
        assert got.tokens == single.tokens
        assert torch.allclose(got.hidden, single.hidden, atol=1e-4)
        with torch.no_grad():
            ref = tiny_lm.model.generate(torch.tensor([ctx]), max_new_tokens=8, do_sample=False, pad_token_id=2)
        ref_tokens = ref[0, len(ctx) :].tolist()
        assert got.tokens == list(ref_tokens[: len(got.tokens)])
        assert got.hidden.shape == (len(got.tokens), tiny_lm.output_head.hidden_size)


def test_per_row_token_limits_and_batch_size_override(tiny_lm):
    """A row stops at its own limit ("length") and leaves the batch; its tokens are those of the same
    context generated alone with that limit, whatever else shares the batch and whatever the batch size."""
    tok = tiny_lm.tokenizer
    contexts = [
        tok(p)["input_ids"] for p in ["Question: what is 2+3?\nAnswer:", "The capital of France is", "Once", "Hi"]
    ]
    limits = [2, 9, 0, 5]
    runner = Runner(tiny_lm, batch_size=1)
    for batch_size in (None, 4):
        got = runner.generate(contexts, max_new_tokens=limits, batch_size=batch_size)
        for ctx, limit, row in zip(contexts, limits, got):
            alone = Runner(tiny_lm, batch_size=1).generate([ctx], max_new_tokens=limit)[0]
            assert row.tokens == alone.tokens and row.finish_reason == alone.finish_reason
            assert len(row.tokens) <= limit
            if row.finish_reason == "length":
                assert len(row.tokens) == limit
    assert got[2].tokens == [] and got[2].finish_reason == "length"
    with pytest.raises(ValueError, match="one per context"):
        runner.generate(contexts, max_new_tokens=[3, 3])


def test_stop_strings_and_sampling_are_reproducible(tiny_lm):
    ctx = tiny_lm.tokenizer("Hello there")["input_ids"]
    runner = Runner(tiny_lm)
    first = runner.generate([ctx], max_new_tokens=12, temperature=1.0, seed=7)[0]
    second = runner.generate([ctx], max_new_tokens=12, temperature=1.0, seed=7)[0]
    assert first.tokens == second.tokens
    text = tiny_lm.tokenizer.decode(first.tokens)
    if len(text.strip()) > 2:
        stop_at = text.strip()[1]
        cut = runner.generate([ctx], max_new_tokens=12, temperature=1.0, seed=7, stop=[stop_at])[0]
        assert cut.finish_reason == "stop" and stop_at not in cut.text


def test_load_errors_are_user_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        load_model("not a model spec")
    with pytest.raises(UnsupportedError, match="use 4bit or 8bit"):  # 4bit itself loads on a CPU (test_quantization)
        load_model("smollm2-135m-instruct", quantize="3bit")
    if not torch.cuda.is_available():
        with pytest.raises(UnsupportedError, match="CUDA"):
            load_model("smollm2-135m-instruct", device="cuda")


@pytest.mark.slow
@pytest.mark.long
def test_embedded_gguf_is_parsed_once_and_its_folder_reloads_with_identical_logits(embedded_lm, tmp_path, monkeypatch):
    """De-quantizing in a fresh cache parses the GGUF once (transformers alone would parse it for the config,
    the tokenizer and the weights). The folder it writes holds the session's weights, and reloads with the
    logits of the model transformers built from the GGUF."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from promptopt.models.load import _dequantized_folder, _resolve

    monkeypatch.setenv("PROMPTOPT_CACHE", str(tmp_path / "cache"))
    parses, built = [], []
    real_reader, real_build = gguf.GGUFReader, AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: parses.append(a) or real_reader(*a, **k))
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1]
    )
    _, folder, filename = _resolve("smollm2-135m-instruct")
    fresh = _dequantized_folder(folder, filename)
    assert len(parses) == 1 and fresh.is_relative_to(tmp_path / "cache") and len(built) == 1
    assert (fresh / "config.json").is_file() and "quantization_config" not in (fresh / "config.json").read_text()
    session = embedded_lm.model.state_dict()
    written = load_file(fresh / "model.safetensors")
    assert all(torch.equal(written[name], session[name]) for name in written)
    ids = torch.tensor([embedded_lm.tokenizer("The sea is")["input_ids"]])
    with torch.no_grad():  # transformers' GGUF model against the cached folder the session loaded
        assert torch.equal(built[0](input_ids=ids).logits, embedded_lm.model(input_ids=ids).logits)
    assert embedded_lm.has_chat_template
    assert embedded_lm.stop_token_ids == {2}
    assert embedded_lm.output_head.vocab_size == 49152


def test_processes_that_need_one_gguf_at_once_dequantize_it_once(tmp_path, monkeypatch):
    """Two callers at the same moment (pytest-xdist workers, search workers): one de-quantizes, the other
    waits on the lock and then finds the folder."""
    import threading
    import time

    from promptopt.models import gguf_cache as load

    monkeypatch.setenv("PROMPTOPT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    calls = []

    def slow_dequantize(folder, filename, target):
        calls.append(target)
        time.sleep(0.5)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(load, "_dequantize", slow_dequantize)
    found = []
    threads = [
        threading.Thread(target=lambda: found.append(load._dequantized_folder(tmp_path, "m.gguf"))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and found == [calls[0], calls[0]]
