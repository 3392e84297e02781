"""What scoring does beyond a plain forward, made invisible in the numbers:

- the shared prefix's KV (promptopt/models/prefix_cache.py): buffers written once and reused by every batch give,
  bit for bit, what a fresh copy of the prefix per batch gives (the runner before them), also on sliding-window
  layers whose window the prefix has already passed; one set of buffers serves every call and prompt;
- the last MLP at the read positions only (promptopt/models/last_layer.py), in the scoring thread only: the same
  predictions and greedy flags, log-probs, hidden states and δ_TCB to float rounding;
- a CPU run keeps the memory it frees (promptopt/models/cpu_memory.py), and the CLI asks torch for huge pages for
  large tensors (promptopt/cli/app.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from promptopt.models import Runner, load_model
from tests.conftest import _save_tiny
from tests.models.test_runner_floor import SHOTS, _plain, _requests


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory, embedded_dir):
    """A 2-layer random Gemma-3 whose first layer has a sliding window of 8 tokens: every shared prefix here is
    longer, so that layer's cache holds only the window's last 7 keys and an offset."""
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
    )
    return load_model(str(_save_tiny(tmp_path_factory.mktemp("tiny-gemma3"), config, embedded_dir)), device="cpu")


def assert_matches_reference(lm, requests, batch_size: int = 3, atol: float = 1e-5):
    """The runner as it scores (buffers, the last MLP where read) against its reference behaviour (a copy of the
    prefix per batch, the last MLP everywhere): what the runner gave before both. Both cut fixed chunks of
    `batch_size` (the shapes the tolerances were measured at; where batches are cut has its own test,
    test_length_batches.py)."""
    reference, runner = Runner(lm, batch_size=batch_size), Runner(lm, batch_size=batch_size)
    reference.reuse_prefix_buffers = reference.skip_unread_positions = False
    reference.forward_overhead_tokens = runner.forward_overhead_tokens = None
    ours, before = runner.loglikelihood(requests), reference.loglikelihood(requests)
    for a, b in zip(ours, before):
        assert a.is_greedy == b.is_greedy
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=atol, rel=0)
        assert torch.allclose(a.hidden, b.hidden, rtol=1e-5, atol=atol)
    head = lm.output_head
    tcb = [head(torch.stack([r.hidden for r in results])).tcb for results in (ours, before)]
    assert torch.allclose(tcb[0], tcb[1], rtol=1e-5, atol=0)
    return ours


def assert_buffers_match_copies(lm, requests, batch_size: int = 3):
    """Scoring on the reused buffers equals, bit for bit, scoring with a fresh copy of the prefix per batch; the
    results and the runner that reused its buffers."""
    reused = Runner(lm, batch_size=batch_size)
    copied = Runner(lm, batch_size=batch_size)
    copied.reuse_prefix_buffers = False
    ours, reference = reused.loglikelihood(requests), copied.loglikelihood(requests)
    assert reused._buffers is not None and copied._buffers is None  # each took its own path
    for a, b in zip(ours, reference):
        assert a.token_logprobs == b.token_logprobs and a.is_greedy == b.is_greedy and torch.equal(a.hidden, b.hidden)
    return ours, reused


@pytest.mark.parametrize("model", ["tiny_lm", "tiny_gemma3"])
def test_reused_buffers_give_what_a_copied_prefix_gives(model, request):
    lm = request.getfixturevalue(model)
    requests = _requests(lm.tokenizer)
    ours, _ = assert_buffers_match_copies(lm, requests)
    for (ctx, cont), res in zip(requests, ours):  # and both are the plain, uncached forward's numbers
        assert res.token_logprobs == pytest.approx(_plain(lm, ctx, cont)[0], abs=1e-5)


@pytest.mark.parametrize("model", ["tiny_lm", "tiny_gemma3"])
@pytest.mark.parametrize("batch_size", [3, 16])
def test_scoring_gives_what_the_runner_gave_before(model, batch_size, request):
    lm = request.getfixturevalue(model)
    assert_matches_reference(lm, _requests(lm.tokenizer), batch_size=batch_size)


def test_one_input_runs_behind_the_cached_few_shot_prefix(tiny_lm):
    """A single input's common prefix is its whole context; the cached few-shot block covers less than 90% of it,
    yet running the rest in its one row costs less than running the whole context again (what a served request
    did: `promptopt serve` answering one input at a time)."""
    tok = tiny_lm.tokenizer
    runner = Runner(tiny_lm, batch_size=4)
    runner.loglikelihood(_requests(tok))  # a batch: the shared few-shot block is cached
    (cached,) = runner._prefixes
    text = SHOTS + "Review: an unexpected delight, start to finish\nSentiment:"
    ctx = tok(text)["input_ids"]
    cont = tok(text + " positive")["input_ids"][len(ctx) :]
    assert len(cached) * 10 < (len(ctx) - 1) * 9  # the old rule's case: the block alone covers < 90%
    (result,) = runner.loglikelihood([(ctx, cont)])
    assert list(runner._prefixes) == [cached]  # reused; no slot (and no forward) for this input's whole context
    assert result.token_logprobs == pytest.approx(_plain(tiny_lm, ctx, cont)[0], abs=1e-5)


def test_the_last_mlp_runs_where_the_hidden_state_is_read_only(tiny_lm):
    """Each row's positions from its context's last token to its end, no padding, nothing earlier."""
    requests = _requests(tiny_lm.tokenizer)
    runner = Runner(tiny_lm, batch_size=16)
    runner.forward_overhead_tokens = None  # one forward of every row (where batches are cut: test_length_batches.py)
    mlp = tiny_lm.base.layers[-1].mlp
    runner.loglikelihood(requests)  # the prefix's own forward (every position) and the MLP's probe happen here
    (prefix,) = runner._prefixes
    first_read: dict[tuple, int] = {}  # distinct input -> the first position any of its requests reads
    for ctx, cont in requests:
        fed = tuple(ctx) + tuple(cont[:-1])
        first_read[fed] = min(first_read.get(fed, len(fed)), len(ctx) - 1)
    seen = []
    handle = mlp.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[:-1].numel()))
    try:
        runner.loglikelihood(requests)
        assert seen == [sum(len(fed) - first for fed, first in first_read.items())]
        runner.skip_unread_positions = False
        seen.clear()
        runner.loglikelihood(requests)
        assert seen == [len(first_read) * (max(map(len, first_read)) - len(prefix))]  # every padded position
    finally:
        handle.remove()


def test_another_thread_on_the_same_model_runs_the_whole_last_mlp(tiny_lm):
    """The last-MLP hooks sit on the shared module: a second runner scoring in another thread while the first is
    inside a forward (a server's concurrent requests) gets its own numbers, and so does the first."""
    import threading

    tok = tiny_lm.tokenizer
    first, second = _requests(tok), _requests(tok, shots="Review: a dull mess.\nSentiment: negative\n\n")
    expected = [Runner(tiny_lm, batch_size=3).loglikelihood(reqs) for reqs in (first, second)]
    mlp = tiny_lm.base.layers[-1].mlp
    got, errors = {}, []

    def run_second():
        try:
            got["second"] = Runner(tiny_lm, batch_size=3).loglikelihood(second)
        except Exception as error:  # noqa: BLE001  (reported below, with the thread's own failure)
            errors.append(error)

    def in_the_middle(module, args):  # inside the first runner's scoring forward, with its hooks on the last MLP
        if threading.current_thread() is threading.main_thread() and mlp._forward_pre_hooks and not got:
            got["overlapped"] = True
            thread = threading.Thread(target=run_second)
            thread.start()
            thread.join()

    handle = tiny_lm.base.layers[0].register_forward_pre_hook(in_the_middle)
    try:
        got["first"] = Runner(tiny_lm, batch_size=3).loglikelihood(first)
    finally:
        handle.remove()
    assert not errors, errors
    assert got.get("overlapped")
    for name, reference in zip(("first", "second"), expected):
        for a, b in zip(got[name], reference):
            assert a.token_logprobs == b.token_logprobs and torch.equal(a.hidden, b.hidden)


def test_a_model_without_a_position_wise_last_mlp_runs_it_everywhere(tiny_lm):
    from promptopt.models import last_layer

    f32 = torch.float32
    assert last_layer.position_wise_last_mlp(tiny_lm.base, 32, f32) is tiny_lm.base.layers[-1].mlp
    assert last_layer.position_wise_last_mlp(torch.nn.Linear(2, 2), 2, f32) is None  # no decoder layers

    class Routed(torch.nn.Module):  # a mixture of experts returns its router logits beside the states
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x):
            return self.proj(x), x.sum(-1)

    base = torch.nn.Module()
    base.layers = torch.nn.ModuleList([torch.nn.Module()])
    base.layers[0].mlp = Routed()
    assert last_layer.position_wise_last_mlp(base, 32, f32) is None
    base.layers[0].mlp = torch.nn.Linear(16, 32)  # fails on the probe: not an MLP over the hidden states
    assert last_layer.position_wise_last_mlp(base, 32, f32) is None


def test_a_prefix_past_the_sliding_window_is_read_at_its_offset(tiny_gemma3):
    """The sliding layer's template keeps the window's last keys and knows how far it has moved."""
    requests = _requests(tiny_gemma3.tokenizer)
    runner = Runner(tiny_gemma3, batch_size=4)
    runner.loglikelihood(requests)
    (template,) = runner._prefixes.values()
    sliding, full = template.layers
    prefix_len = len(next(iter(runner._prefixes)))
    assert prefix_len > 8 and sliding.cumulative_length == prefix_len and sliding.keys.shape[-2] == 7
    assert full.keys.shape[-2] == prefix_len
    cache = runner._buffers.cache(template, rows=4, width=5)
    assert cache.layers[0].get_mask_sizes(5) == (7 + 5, prefix_len - 7)  # the window's offset, as transformers keeps it


def test_one_set_of_buffers_serves_every_batch_call_and_prompt(tiny_lm):
    tok = tiny_lm.tokenizer
    runner = Runner(tiny_lm, batch_size=4)
    runner.loglikelihood(_requests(tok))
    storage = dict(runner._buffers._storage)
    assert len(storage) == 2 * tiny_lm.model.config.num_hidden_layers  # a key and a value buffer per layer
    first = runner._buffers._built[-1]
    runner.loglikelihood(_requests(tok))  # the same prompt again: the very same cache
    assert runner._buffers._built[-1] is first
    shorter = _requests(tok, shots="Review: a dull mess.\nSentiment: negative\n\n")  # another prompt, a shorter prefix
    assert_reference = Runner(tiny_lm, batch_size=4)
    assert_reference.reuse_prefix_buffers = False
    for a, b in zip(runner.loglikelihood(shorter), assert_reference.loglikelihood(shorter)):
        assert a.token_logprobs == b.token_logprobs and torch.equal(a.hidden, b.hidden)
    assert all(runner._buffers._storage[key] is flat for key, flat in storage.items())  # written over, not reallocated
    longer = [(ctx, cont) for ctx, cont in _requests(tok, shots=SHOTS * 3)]
    runner.loglikelihood(longer)
    assert all(runner._buffers._storage[key] is not flat for key, flat in storage.items())  # grown for a longer prefix


def test_a_cache_with_other_layers_runs_whole_prompts(tiny_lm, monkeypatch):
    """A model whose cache has layers prefix_cache cannot extend (linear attention, quantized...) is scored on whole
    prompts, with the same numbers."""
    from promptopt.models import prefix_cache

    monkeypatch.setattr(prefix_cache, "_AFTER_PREFIX", {})
    requests = _requests(tiny_lm.tokenizer)
    runner = Runner(tiny_lm, batch_size=3)
    results = runner.loglikelihood(requests)
    assert runner._prefix_unsupported and not runner._prefixes and runner._buffers is None
    for (ctx, cont), res in zip(requests, results):
        assert res.token_logprobs == pytest.approx(_plain(tiny_lm, ctx, cont)[0], abs=1e-5)


def test_a_cpu_runner_keeps_freed_memory_in_the_process(tiny_lm, monkeypatch):
    """The runner on CPU sets glibc's mmap and trim thresholds once per process (their effect on page faults is
    measured by bench/bench_scoring.py, first calls with and without)."""
    import ctypes

    from promptopt.models import cpu_memory

    calls = []

    class Mallopt:  # stands in for libc's function (ctypes sets its argument types)
        argtypes = restype = None

        def __call__(self, param, value):
            calls.append((param, value))
            return 1

    libc = type("Libc", (), {"mallopt": Mallopt()})()
    monkeypatch.setattr(cpu_memory, "_applied", None)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(cpu_memory.sys, "platform", "linux")
    Runner(tiny_lm)
    Runner(tiny_lm)
    assert calls == [(-3, 32 << 20), (-1, 256 << 20)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD; once
    assert cpu_memory.keep_freed_memory()


_HUGE_PAGES_PROBE = """
import os
from promptopt.cli.app import huge_pages_for_large_tensors
applies = huge_pages_for_large_tensors()
import torch
tensor = torch.ones(8 << 20, dtype=torch.uint8)  # 8 MB: past torch's 2 MB threshold for huge pages
address, inside = tensor.data_ptr(), False
for line in open('/proc/self/smaps'):
    first = line.split()[0]
    if '-' in first and not first.endswith(':'):  # a mapping's first line: its address range
        low, high = (int(x, 16) for x in first.split('-'))
        inside = low <= address < high
    elif inside and first == 'VmFlags:':
        print(applies, os.environ.get('THP_MEM_ALLOC_ENABLE'), 'hg' in line.split()[1:])
"""


@pytest.mark.skipif(
    not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"), reason="no transparent huge pages (not Linux)"
)
@pytest.mark.long
def test_the_cli_asks_torch_for_huge_pages_before_torch_is_imported():
    """`huge_pages_for_large_tensors` (the CLI's first step) sets THP_MEM_ALLOC_ENABLE so that a large CPU tensor's
    mapping is advised for huge pages (VmFlags `hg`); the user's own 0 wins; after torch is imported it is too late
    and says so. Its effect on a first call's page faults is measured in fresh processes (the function's docstring)."""

    def probe(code, **env):
        base = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
        out = subprocess.run(
            [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True
        )
        return out.stdout.split()

    assert probe(_HUGE_PAGES_PROBE) == ["True", "1", "True"]
    assert probe(_HUGE_PAGES_PROBE, THP_MEM_ALLOC_ENABLE="0") == ["False", "0", "False"]
    late = "import torch\nfrom promptopt.cli.app import huge_pages_for_large_tensors\nprint(huge_pages_for_large_tensors())"
    assert probe(late) == ["False"]
    # `--help` imports torch (it lists the registries): the variable must already be set when torch arrives
    cli = (
        "import os, sys\nseen = []\nclass Watch:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and not seen:\n            seen.append(os.environ.get('THP_MEM_ALLOC_ENABLE'))\n"
        "sys.meta_path.insert(0, Watch())\nfrom promptopt.cli import main\nsys.argv = ['promptopt', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\nprint(seen[0] if seen else 'never')"
    )
    assert probe(cli)[-1] == "1"
