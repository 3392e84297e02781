"""The work bound bench/bench_lmeval.py prints beside its ratio (the model FLOPs each tool cannot avoid), against
counts made by hand on a tiny random model and a character tokenizer."""

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_lmeval.py"


def bench():
    """The bench as a module; the environment it sets for its own process (offline hub, huge pages) is put back."""
    saved = dict(os.environ)
    try:
        spec = importlib.util.spec_from_file_location("bench_lmeval", BENCH)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


def chars(text, add_special_tokens=False):
    return {"input_ids": [ord(c) - 90 for c in text]}


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    return SimpleNamespace(model=LlamaForCausalLM(config), tokenizer=chars)


# two items of two requests each; no token prefix common to all four
SAMPLES = [
    {"arguments": [("ab", "cd"), ("ab", "xy")]},
    {"arguments": [("pq", "rs"), ("pq", "tu")]},
]
# the body's matrices: q 8x8, k and v 8x4 (one key/value head of 4), o 8x8, gate and up 16x8, down 8x16
BODY = 64 + 32 + 32 + 64 + 3 * 128
HEAD = 40 * 8


def test_packed_work_is_counted_by_hand(lm):
    work = bench().model_work(SAMPLES, lm, packed=True)
    # lm-eval: every request's (context + continuation)[:-1], 3 tokens, through body and head: 6 per item
    assert work["theirs_tokens"] == 6
    # promptopt: an item's common part (2 tokens) once, then each tail (1 token): 4; head rows: 2 + 2 continuation tokens
    assert work["ours_tokens"] == 4 and work["ours_rows"] == 4
    assert work["theirs_gflop"] == pytest.approx(6 * (2 * BODY + 2 * HEAD) / 1e9)
    assert work["ours_gflop"] == pytest.approx((4 * 2 * BODY + 4 * 2 * HEAD) / 1e9)
    assert work["bound"] == pytest.approx(1.5)


def test_unpacked_work_runs_each_request_whole(lm):
    work = bench().model_work(SAMPLES, lm, packed=False)
    assert work["ours_tokens"] == 6 and work["ours_rows"] == 4
    assert work["bound"] == pytest.approx(6 * (2 * BODY + 2 * HEAD) / (6 * 2 * BODY + 4 * 2 * HEAD))


def test_a_prefix_common_to_every_request_runs_once_per_call(lm):
    shots = [{"arguments": [("zzab", "cd"), ("zzab", "xy")]}, {"arguments": [("zzpq", "rs"), ("zzpq", "tu")]}]
    work = bench().model_work(shots, lm, packed=False)
    # "zz" once for the call (1 per item), then each request's 3 tokens after it
    assert work["ours_tokens"] == 1 + 6 and work["theirs_tokens"] == 10
