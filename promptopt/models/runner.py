"""Run a loaded model: batched log-likelihood scoring and generation, both with shared-prefix KV reuse.

Every prompt of a study repeats the same instruction and exemplar block before each item. That block is
found in *token space* (longest common prefix of the fully tokenized inputs), run once, and its KV cache
is broadcast to every batch (prefix_cache.py). Splitting on text instead is wrong: a tokenizer may merge across
the seam ("\\n\\n" alone vs "\\n","\\n" in context), shifting answer log-probs by tenths of a nat. Scoring
runs the last layer's MLP only where a hidden state is read (last_layer.py), and a CPU runner keeps the memory
it frees in the process (cpu_memory.py).

The runner's jobs live in their own modules: scoring (loglikelihood.py, and packing.py where an item's context is
shared by its choices), generation (generation.py), the CPU attention path (attention.py); this module holds the
runner itself, its prefix cache and the forward both jobs run.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from promptopt.models import last_layer
from promptopt.models.attention import GROUPED_SDPA as _GROUPED_SDPA
from promptopt.models.attention import use_grouped_sdpa
from promptopt.models.cpu_memory import keep_freed_memory
from promptopt.models.generation import GenerationMixin, GenerationResult, cut_at_stop
from promptopt.models.load import LoadedModel
from promptopt.models.loglikelihood import LoglikelihoodMixin, LoglikelihoodResult

if TYPE_CHECKING:
    from transformers import Cache

__all__ = ["GenerationResult", "LoglikelihoodResult", "Runner", "_GROUPED_SDPA", "common_prefix_length", "cut_at_stop"]

_PREFIX_CACHE_SLOTS = 4


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    if not sequences:
        return 0
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        i = 0
        while i < n and seq[i] == first[i]:
            i += 1
        n = i
    return n


class Runner(LoglikelihoodMixin, GenerationMixin):
    """Scores and generates with one model, reusing the KV cache of the longest shared token prefix."""

    def __init__(self, lm: LoadedModel, *, batch_size: int | str = 16, progress: bool = False) -> None:
        from promptopt.models.batch_size import AUTO, AUTO_START

        self.auto_batch = batch_size == AUTO  # the largest batch that fits, found by halving (batch_size.py)
        if self.auto_batch:
            batch_size = AUTO_START
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or 'auto', got {batch_size!r}")
        self.lm = lm
        self.batch_size = batch_size
        self.progress = progress
        self._prefixes: OrderedDict[tuple[int, ...], Cache] = OrderedDict()  # prefix ids -> its one-row cache
        self._prefix_unsupported = False
        self._buffers = None  # prefix_cache.PrefixBuffers, made on the first prefix-cached scoring call
        self.use_prefix_cache = True
        self.reuse_prefix_buffers = (
            True  # off: every scoring batch copies the prefix (the reference behaviour, for tests)
        )
        self._last_mlp: torch.nn.Module | None | bool = False  # looked up on the first scoring call
        self.skip_unread_positions = (
            True  # off: scoring runs the last MLP everywhere (the reference behaviour, for tests)
        )
        self.compact = True  # generation drops finished rows from the batch (off: the reference behaviour, for tests)
        # scoring runs an item's shared context once for all its choices where no few-shot prefix does (packing.py);
        # off: every input whole (the reference behaviour, for tests)
        self.share_item_contexts = True
        self.last_call_packed = False  # whether the last loglikelihood call packed its inputs
        use_grouped_sdpa(lm.model)
        if lm.device.type == "cpu":
            keep_freed_memory()  # else a process's first scoring call page-faults ~2 GB back in (cpu_memory.py)

    # --- batch size auto -------------------------------------------------------------------------
    @functools.wraps(LoglikelihoodMixin.loglikelihood)  # its signature and docs (the contract test reads them)
    def loglikelihood(self, *args, **kwargs) -> list[LoglikelihoodResult]:
        return self._fitting(lambda: LoglikelihoodMixin.loglikelihood(self, *args, **kwargs))

    @functools.wraps(GenerationMixin.generate)
    def generate(self, *args, **kwargs) -> list[GenerationResult]:
        return self._fitting(lambda: GenerationMixin.generate(self, *args, **kwargs))

    def _fitting(self, call):
        """`call()`; with batch_size auto, run again at half the rows while it runs out of memory (batch_size.py)."""
        if not self.auto_batch:
            return call()
        from promptopt.models.batch_size import run_fitting

        return run_fitting(call, get=lambda: self.batch_size, set_=lambda n: setattr(self, "batch_size", n))

    # --- prefix cache --------------------------------------------------------------------------
    def _prefix(self, sequences: Sequence[Sequence[int]], limit: int) -> tuple[int, Cache | None]:
        """Length P of the shared prefix to reuse (≤ limit) and its one-row cache (`prefix_cache`'s template)."""
        if not self.use_prefix_cache or self._prefix_unsupported:
            return 0, None
        lcp = min(common_prefix_length(sequences), limit)
        if lcp <= 0:
            return 0, None
        first = tuple(sequences[0][:lcp])
        # Reuse the longest cached prefix that all sequences share, if it covers most of the LCP.
        best = max((k for k in self._prefixes if len(k) <= lcp and first[: len(k)] == k), key=len, default=None)
        if best is not None and len(best) * 10 >= lcp * 9:
            self._prefixes.move_to_end(best)
            return len(best), self._prefixes[best]
        from promptopt.models import prefix_cache

        ids = torch.tensor([first], device=self.lm.device)
        with torch.inference_mode():
            out = self.lm.base(input_ids=ids, use_cache=True)
        template = getattr(out, "cache", None) or out.past_key_values
        if not prefix_cache.supported(template):
            self._prefix_unsupported = True  # e.g. linear-attention layers: every call runs whole prompts
            return 0, None
        self._prefixes[first] = template
        while len(self._prefixes) > _PREFIX_CACHE_SLOTS:
            self._prefixes.popitem(last=False)
        return lcp, template

    def _scoring_caches(self, prefix: Cache | None, *, rows: int, width: int):
        """batch rows -> the cache a scoring batch of up to `rows` rows and `width` tokens runs on (None without
        a prefix): one cache over `PrefixBuffers` for them all, or with `reuse_prefix_buffers` off a fresh copy
        of the prefix for each."""
        from promptopt.models import prefix_cache

        if prefix is None:
            return lambda batch_rows: None
        if not self.reuse_prefix_buffers:
            return lambda batch_rows: prefix_cache.growing_cache(prefix, batch_rows)
        if self._buffers is None:
            self._buffers = prefix_cache.PrefixBuffers()
        cache = self._buffers.cache(prefix, rows=rows, width=width)
        return lambda batch_rows: cache

    def _growing_cache(self, prefix: Cache | None, rows: int) -> Cache:
        """A cache for decoding `rows` rows, starting after the prefix when there is one."""
        from transformers import DynamicCache

        from promptopt.models import prefix_cache

        return DynamicCache(config=self.lm.model.config) if prefix is None else prefix_cache.growing_cache(prefix, rows)

    def _skippable_mlp(self) -> torch.nn.Module | None:
        """The last MLP that scoring runs at the positions it reads only (`last_layer.py`), or None."""
        if not self.skip_unread_positions:
            return None
        if self._last_mlp is False:
            dtype = (
                self.lm.model.get_input_embeddings().weight.dtype
            )  # what the hidden states flow in (4-bit weights too)
            self._last_mlp = last_layer.position_wise_last_mlp(self.lm.base, self.lm.output_head.hidden_size, dtype)
        return self._last_mlp

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> tuple:
        kwargs = {self.lm.cache_kwarg: cache} if cache is not None else {}
        out = self.lm.base(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None, **kwargs
        )
        return out.last_hidden_state, cache
