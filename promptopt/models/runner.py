"""Run a loaded model: batched log-likelihood scoring and generation, both with shared-prefix KV reuse.

Every prompt of a study repeats the same instruction and exemplar block before each item. That block is
found in *token space* (longest common prefix of the fully tokenized inputs), run once, and its KV cache
is broadcast to every batch (prefix_cache.py). Splitting on text instead is wrong: a tokenizer may merge across
the seam ("\\n\\n" alone vs "\\n","\\n" in context), shifting answer log-probs by tenths of a nat. Scoring
runs the last layer's MLP only where a hidden state is read (last_layer.py), and a CPU runner keeps the memory
it frees in the process (cpu_memory.py).

Scoring (`loglikelihood`): log p(continuation | context) per request, the hidden state and δ_TCB at the position that
predicts each continuation's first token, with one batched projection through the output head. Where there is no
few-shot prefix (0-shot), the contexts an item's choices share are run once instead (packing.py).

Generation (`generate`): greedy or sampled decoding with logits processors, stop strings and per-row limits, on top
of the same prefix cache; finished rows leave the batch when the processors allow it.

One class, one module: the runner, its prefix cache, the forward both jobs run, and the two jobs. Pure helpers live
beside it: packing.py (the packed layout), hidden_states.py (what a call reads), prefix_cache.py (the KV caches),
attention.py (the CPU attention path), last_layer.py, length_batches.py (where scoring batches are cut).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from promptopt import progress
from promptopt.models import last_layer
from promptopt.models.attention import GROUPED_SDPA as _GROUPED_SDPA
from promptopt.models.attention import use_grouped_sdpa
from promptopt.models.cpu_memory import keep_freed_memory
from promptopt.models.hidden_states import States
from promptopt.models.length_batches import CPU_FORWARD_TOKENS, length_batches
from promptopt.models.load import LoadedModel
from promptopt.models.token_prefix import common_prefix_length

if TYPE_CHECKING:
    from transformers import Cache

__all__ = ["GenerationResult", "LoglikelihoodResult", "Runner", "_GROUPED_SDPA", "common_prefix_length", "cut_at_stop"]

_PREFIX_CACHE_SLOTS = 4


@dataclass
class LoglikelihoodResult:
    logprob: float  # Σ log p(continuation | context)
    token_logprobs: list[float]
    is_greedy: bool  # every continuation token was the argmax
    hidden: torch.Tensor  # final hidden state at the position that predicts the first continuation token
    tcb: dict | None = None  # δ_TCB and its companions there (TCBResult's fields as numbers), when asked for


@runtime_checkable
class FollowsRows(Protocol):
    """A logits processor with per-row state that follows the batch when finished rows leave it (generation drops
    them: `compact`), like TabooLogitsProcessor."""

    def select_rows(self, index: torch.Tensor, chosen: torch.Tensor) -> None:
        """Keep the rows at `index` (positions in the current batch); `chosen`: the tokens just chosen, all rows."""


@runtime_checkable
class KeepsLogs(Protocol):
    """A logits processor that keeps a log per row, returned when generation ends (GenerationResult.processor_logs)."""

    def finalize(self, output_ids: torch.Tensor) -> list:
        """The per-row logs, given the last chosen tokens (rows, 1)."""


@runtime_checkable
class Truncatable(Protocol):
    """A row's processor log that can be cut to the steps the row really took."""

    def truncate(self, steps: int): ...


def _compactable(processors) -> bool:
    """Finished rows may leave a batch when every processor is stateless across rows (temperature, top-p) or
    follows them (`FollowsRows`)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    return all(isinstance(p, (FollowsRows, TemperatureLogitsWarper, TopPLogitsWarper)) for p in processors)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """`text` cut before the earliest stop string, and whether one occurred (how a generation ends)."""
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, up to and including the one that completed a stop string
    text: str  # decoded, cut before the first stop string
    finish_reason: str  # "eos" | "stop" | "length"
    hidden: torch.Tensor  # (len(tokens), d): the hidden state that predicted each generated token
    token_char_ends: list[int] = field(default_factory=list)  # end offset of each token in `text`'s frame
    processor_logs: list = field(default_factory=list)  # per-sequence logs of processors that keep them


class Runner:
    """Scores and generates with one model, reusing the KV cache of the longest shared token prefix."""

    def __init__(self, lm: LoadedModel, *, batch_size: int | str = 16, progress: bool = False) -> None:
        from promptopt.models.batch_size import AUTO, AUTO_START

        self.auto_batch = batch_size == AUTO  # the largest batch that fits, found by halving (batch_size.py)
        self.announced_batch_size: int | None = None  # what auto last said it chose (a note line each change)
        if self.auto_batch:
            batch_size = AUTO_START
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or 'auto', got {batch_size!r}")
        self.lm = lm
        self.batch_size = batch_size
        # a forward's fixed cost in padded tokens, which sets where scoring batches are cut (length_batches.py);
        # None: fixed chunks of batch_size (off a CPU, where it was not measured)
        self.forward_overhead_tokens = CPU_FORWARD_TOKENS if lm.device.type == "cpu" else None
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
        self._packable: bool | None = None  # `packable`, looked up on the first scoring call
        use_grouped_sdpa(lm.model)
        if lm.device.type == "cpu":
            keep_freed_memory()  # else a process's first scoring call page-faults ~2 GB back in (cpu_memory.py)

    # --- batch size auto -------------------------------------------------------------------------
    def loglikelihood(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        tcb_targets: Sequence[int] | None = None,
        eps: float = 1.0,
        groups: Sequence | None = None,
    ) -> list[LoglikelihoodResult]:
        """log p(continuation | context) for (context ids, continuation ids) pairs (`_score`), at the batch size
        that fits when it is `auto`."""
        return self._fitting(lambda: self._score(requests, tcb_targets=tcb_targets, eps=eps, groups=groups))

    def generate(self, contexts: Sequence[Sequence[int]], **options) -> list[GenerationResult]:
        """Decode each context (`_decode`: its options), at the batch size that fits when it is `auto`."""
        return self._fitting(lambda: self._decode(contexts, **options))

    def _fitting(self, call):
        """`call()`; with batch_size auto, run again at half the rows while it runs out of memory (batch_size.py)."""
        if not self.auto_batch:
            return call()
        from promptopt.models.batch_size import print_auto_note, run_fitting

        def say(size: int) -> None:
            self.announced_batch_size = size
            print_auto_note(size)

        return run_fitting(
            call,
            get=lambda: self.batch_size,
            set_=lambda n: setattr(self, "batch_size", n),
            said=lambda: self.announced_batch_size,
            say=say,
        )

    # --- prefix cache --------------------------------------------------------------------------
    def _prefix(self, sequences: Sequence[Sequence[int]], limit: int) -> tuple[int, Cache | None]:
        """Length P of the shared prefix to reuse (≤ limit) and its one-row cache (`prefix_cache`'s template)."""
        if not self.use_prefix_cache or self._prefix_unsupported:
            return 0, None
        lcp = min(common_prefix_length(sequences), limit)
        if lcp <= 0:
            return 0, None
        first = tuple(sequences[0][:lcp])
        # Reuse the longest cached prefix that all sequences share, if it covers most of the LCP, or if running the
        # rest of the LCP in every row costs no more than running the LCP once (always, for one row: a single
        # input's LCP is its whole context, which would otherwise run again in full behind a cached few-shot block)
        best = max((k for k in self._prefixes if len(k) <= lcp and first[: len(k)] == k), key=len, default=None)
        if best is not None and (len(best) * 10 >= lcp * 9 or len(sequences) * (lcp - len(best)) <= lcp):
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

    def scoring_caches(self, prefix: Cache | None, *, rows: int, width: int):
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

    def skippable_mlp(self) -> torch.nn.Module | None:
        """The last MLP that scoring runs at the positions it reads only (`last_layer.py`), or None."""
        if not self.skip_unread_positions:
            return None
        if self._last_mlp is False:
            dtype = (
                self.lm.model.get_input_embeddings().weight.dtype
            )  # what the hidden states flow in (4-bit weights too)
            self._last_mlp = last_layer.position_wise_last_mlp(self.lm.base, self.lm.output_head.hidden_size, dtype)
        return self._last_mlp

    @property
    def packable(self) -> bool:
        """Whether this model takes a packed row's mask exactly (packing.py `packable`), looked up once."""
        if self._packable is None:
            from promptopt.models import packing

            self._packable = packing.packable(self.lm)
        return self._packable

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> tuple:
        """One forward of the base model over a batch (ids, 4-d boolean mask, positions, the cache it extends or
        None) -> (last hidden states, cache): the scoring paths' one way into the model, packing's included."""
        return self._forward(ids, mask, positions, cache)

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> tuple:
        kwargs = {self.lm.cache_kwarg: cache} if cache is not None else {}
        out = self.lm.base(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=cache is not None, **kwargs
        )
        return out.last_hidden_state, cache

    # --- scoring ------------------------------------------------------------------------------------
    def _score(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        tcb_targets: Sequence[int] | None = None,
        eps: float = 1.0,
        groups: Sequence | None = None,
    ) -> list[LoglikelihoodResult]:
        """log p(continuation | context) for (context ids, continuation ids) pairs.

        `tcb_targets` (a token id per request) asks for δ_TCB (ε = `eps`) with that target at each request's
        critical position, the one that predicts its first continuation token (`LoglikelihoodResult.tcb`): it is
        read from the logits the log-probs come from, so W·h runs once for both.

        `groups` (one hashable per request, e.g. the item it scores; default: requests with the same context ids)
        says which requests share a context: where no few-shot prefix does the work, each group's common token
        prefix runs once and its continuations are packed after it (packing.py)."""
        from promptopt.models import packing

        for ctx, cont in requests:
            if not ctx or not cont:
                raise ValueError("every request needs a non-empty context and continuation")
        if tcb_targets is not None and len(tcb_targets) != len(requests):
            raise ValueError(f"tcb_targets: {len(tcb_targets)} targets for {len(requests)} requests")
        if groups is not None and len(groups) != len(requests):
            raise ValueError(f"groups: {len(groups)} groups for {len(requests)} requests")
        fed = [tuple(list(ctx) + list(cont))[:-1] for ctx, cont in requests]
        unique = list(dict.fromkeys(fed))  # identical inputs (e.g. one-token choices) run once
        prefix_len, prefix = self._prefix(unique, min(len(ctx) for ctx, _ in requests) - 1)
        first_needed: dict[tuple[int, ...], int] = {}  # earliest absolute position any request reads from each input
        for (ctx, _), seq in zip(requests, fed):
            first_needed[seq] = min(first_needed.get(seq, len(seq)), len(ctx) - 1)
        plan = packing.plan(self, requests, fed, prefix_len, groups)
        if plan is not None:
            states = packing.run(self, plan, first_needed, prefix_len, prefix)
        else:
            states = self._plain_states(unique, first_needed, prefix_len, prefix)
        self.last_call_packed = plan is not None
        return self._project(requests, fed, states, tcb_targets, eps)

    def _plain_states(self, unique, first_needed, prefix_len: int, prefix) -> States:
        """Every distinct input after the prefix as its own row, longest first, in batches of at most `batch_size`
        rows cut where padding costs least (length_batches.py)."""
        from tqdm.auto import tqdm

        states = States()
        order = sorted(unique, key=len, reverse=True)
        pad = self.lm.tokenizer.pad_token_id or 0
        sizes = length_batches([len(s) - prefix_len for s in order], self.batch_size, self.forward_overhead_tokens)
        ends = list(itertools.accumulate(sizes))
        batches = [order[end - n : end] for end, n in zip(ends, sizes)]
        cache_for = self.scoring_caches(prefix, rows=max(sizes), width=len(order[0]) - prefix_len)
        meter, done = progress.meter("scoring", len(order), "inputs"), 0
        for batch in tqdm(batches, desc="scoring", disable=not self.progress, leave=False):
            done += len(batch)
            suffixes = [seq[prefix_len:] for seq in batch]
            width = max(len(s) for s in suffixes)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), prefix_len + width), dtype=torch.long)
            mask[:, :prefix_len] = 1
            for row, suffix in enumerate(suffixes):
                ids[row, : len(suffix)] = torch.tensor(suffix)
                mask[row, prefix_len : prefix_len + len(suffix)] = 1
            positions = (prefix_len + torch.arange(width)).expand(len(batch), -1)
            dev = self.lm.device
            mlp, read = self.skippable_mlp(), None
            if mlp is not None:  # the flattened (row × position) indices whose final hidden state is read below
                read = torch.cat(
                    [
                        row * width + torch.arange(first_needed[seq] - prefix_len, len(seq) - prefix_len)
                        for row, seq in enumerate(batch)
                    ]
                ).to(dev)
            with torch.inference_mode(), last_layer.mlp_only_at(mlp, read):
                hidden, _ = self._forward(ids.to(dev), mask.to(dev), positions.to(dev), cache_for(len(batch)))
            for row, seq in enumerate(batch):
                first = first_needed[seq] - prefix_len
                states.add(seq, first_needed[seq], hidden[row, first : len(seq) - prefix_len].float().clone())
            meter.update(done)
        return states

    def _project(self, requests, fed, states: States, tcb_targets, eps: float) -> list[LoglikelihoodResult]:
        """One batched vocabulary projection for every position any request needs (a per-request matvec would
        re-read W each time); a position shared by requests (the same input, or a context a group runs once) is
        projected once, and so is δ_TCB for a (position, target) pair."""
        slots: dict[tuple, int] = {}
        rows, wanted_row, wanted_token = [], [], []
        critical: dict[tuple[int, int], int] = {}  # (row, δ_TCB target) -> its index among the δ_TCB rows
        critical_of = []  # request -> that index
        for r, ((ctx, cont), seq) in enumerate(zip(requests, fed)):
            for i, token in enumerate(cont):
                key = states.key(seq, len(ctx) - 1 + i)
                if key not in slots:
                    slots[key] = len(rows)
                    rows.append(states.at(seq, len(ctx) - 1 + i))
                wanted_row.append(slots[key])
                wanted_token.append(token)
            if tcb_targets is not None:
                row = slots[states.key(seq, len(ctx) - 1)]
                critical_of.append(critical.setdefault((row, int(tcb_targets[r])), len(critical)))
        asked = None if tcb_targets is None else (torch.tensor(list(critical), dtype=torch.long).view(-1, 2), eps)
        logprobs, argmax, tcb_of_pair = self._target_logprobs(
            torch.stack(rows), torch.tensor(wanted_row), torch.tensor(wanted_token), tcb=asked
        )
        results, cursor = [], 0
        for (ctx, cont), seq in zip(requests, fed):
            span = slice(cursor, cursor + len(cont))
            cursor += len(cont)
            token_lp = logprobs[span]
            greedy = bool((argmax[torch.tensor(wanted_row[span])] == torch.tensor(wanted_token[span])).all())
            tcb = None if tcb_of_pair is None else tcb_of_pair[critical_of[len(results)]]
            hidden = states.at(seq, len(ctx) - 1).cpu().clone()
            results.append(LoglikelihoodResult(float(token_lp.sum()), token_lp.tolist(), greedy, hidden, tcb))
        return results

    def _target_logprobs(
        self, rows: torch.Tensor, row_index: torch.Tensor, tokens: torch.Tensor, chunk: int = 256, tcb=None
    ):
        """log p(token | row) for each (row_index, token) pair, plus each row's argmax; chunked so the
        full (rows × vocab) matrix never exists at once. `tcb`: ((row, target) pairs (m, 2), ε) -> also δ_TCB at
        those rows from the same logits, a dict of TCBResult's fields as numbers per pair (else None)."""
        geometry = self.lm.output_head
        out = torch.empty(len(tokens), dtype=torch.float32)
        argmax = torch.empty(rows.shape[0], dtype=torch.long)
        pairs, eps = tcb if tcb is not None else (torch.empty(0, 2, dtype=torch.long), None)
        found: list[dict | None] = [None] * len(pairs)
        with torch.inference_mode():
            for start in range(0, rows.shape[0], chunk):
                block = rows[start : start + chunk].to(geometry.weight.device)
                logits, gain = geometry.logits_and_gain(block) if tcb is not None else (geometry.logits(block), None)
                chosen = ((pairs[:, 0] >= start) & (pairs[:, 0] < start + chunk)).nonzero().flatten()
                if len(chosen):
                    at = (pairs[chosen, 0] - start).to(block.device)
                    read = block, logits, gain
                    if not torch.equal(
                        at, torch.arange(len(block), device=block.device)
                    ):  # else every row, in order: no copy
                        read = block[at], logits[at], None if gain is None else gain[at]
                    res = geometry(read[0], eps=eps, target=pairs[chosen, 1], logits=read[1:])
                    columns = {name: value.cpu().tolist() for name, value in res.to_dict().items()}
                    for j, index in enumerate(chosen.tolist()):
                        found[index] = {name: column[j] for name, column in columns.items()}
                argmax[start : start + chunk] = logits.argmax(-1).cpu()
                mask = (row_index >= start) & (row_index < start + chunk)
                # log p(token) = z_token − logsumexp(z): the normalizer per row, never a whole log-softmax table
                local, wanted = (row_index[mask] - start).to(logits.device), tokens[mask].to(logits.device)
                norm = torch.logsumexp(logits.float(), dim=-1)
                out[mask] = (logits[local, wanted].float() - norm[local]).cpu()
        return out, argmax, None if tcb is None else found

    # --- generation ---------------------------------------------------------------------------------
    def _decode(
        self,
        contexts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int] = 256,
        stop: Sequence[str] = (),
        logits_processor=None,
        processor_factory=None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        keep_hidden: bool = True,
        batch_size: int | None = None,
    ) -> list[GenerationResult]:
        """Decode each context (greedy, or sampled when temperature > 0), stopping at EOS or a stop string.

        `max_new_tokens` is one limit for all contexts or one per context (a row that reaches its own limit
        ends with "length" and leaves the batch, so its result does not depend on what else is batched with it).
        `batch_size` overrides the runner's for this call: short requests (paraphrase prompts) fit more rows
        in the same memory, and every decoding step reads all the weights once however many rows it carries.

        `keep_hidden=False` drops the per-token final hidden states (scoring reads δ_TCB from them; stress
        does not, and on a large model 500 items × 512 tokens of them are gigabytes of host memory).

        `logits_processor` is a transformers `LogitsProcessor` (or a list of them); it sees the full ids so
        far and the raw scores, exactly as inside `model.generate`. `processor_factory` instead builds a
        fresh one for each batch; a processor that `KeepsLogs` (`finalize(output_ids)`) returns per-row logs,
        which land in each result's `processor_logs`.
        """
        from tqdm.auto import tqdm
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        def processors_for_batch() -> LogitsProcessorList:
            processors = LogitsProcessorList()
            chosen = processor_factory() if processor_factory is not None else logits_processor
            if chosen is not None:
                processors.extend(chosen if isinstance(chosen, list) else [chosen])
            if temperature > 0:
                processors.append(TemperatureLogitsWarper(temperature))
                if top_p < 1.0:
                    processors.append(TopPLogitsWarper(top_p))
            return processors

        generator = None
        if temperature > 0:
            generator = torch.Generator(device=self.lm.device).manual_seed(0 if seed is None else seed)
        limits = (
            [max_new_tokens] * len(contexts) if isinstance(max_new_tokens, int) else [int(n) for n in max_new_tokens]
        )
        if len(limits) != len(contexts) or any(n < 0 for n in limits):
            raise ValueError(
                f"max_new_tokens: expected one non-negative limit or one per context ({len(contexts)}), got {max_new_tokens!r}"
            )
        size = batch_size or self.batch_size
        order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]), reverse=True)
        results: list[GenerationResult | None] = [None] * len(contexts)
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        meter = progress.meter("generating", len(contexts), "items", warmup=True)  # the first step holds the prefill
        # the work is decoding steps: a batch runs until its longest row stops (at most its largest limit), and a
        # step costs about the same whatever rows are left, so the estimate assumes the rest runs to that limit
        steps_total = max(1, sum(max(limits[i] for i in batch) for batch in batches))
        items_before, steps_before = 0, 0
        for number, batch in enumerate(tqdm(batches, desc="generating", disable=not self.progress, leave=False), 1):
            where = f" of batch {number}/{len(batches)}" if len(batches) > 1 else ""
            longest = max(limits[i] for i in batch)

            def on_step(
                finished, step, items_before=items_before, steps_before=steps_before, longest=longest, where=where
            ):
                meter.update(
                    items_before + finished,
                    fraction=(steps_before + step) / steps_total,
                    note=f" (step {step}/{longest}{where})",
                )

            outs = self._generate_batch(
                [list(contexts[i]) for i in batch],
                [limits[i] for i in batch],
                list(stop),
                processors_for_batch(),
                temperature > 0,
                generator,
                keep_hidden,
                on_step=on_step,
            )
            for i, out in zip(batch, outs):
                results[i] = out
            items_before += len(batch)
            steps_before += longest
        return results  # type: ignore[return-value]

    def _generate_batch(self, contexts, limits, stop, processors, sample, generator, keep_hidden=True, on_step=None):
        tok = self.lm.tokenizer
        dev = self.lm.device
        geometry = self.lm.output_head
        prefix_len, prefix = self._prefix(contexts, min(len(c) for c in contexts) - 1)
        b = len(contexts)
        suffixes = [c[prefix_len:] for c in contexts]
        width = max(len(s) for s in suffixes)
        pad = tok.pad_token_id or 0
        ids = torch.full((b, width), pad, dtype=torch.long)
        mask = torch.zeros((b, prefix_len + width), dtype=torch.long)
        mask[:, :prefix_len] = 1
        positions = torch.full((b, width), prefix_len, dtype=torch.long)
        for row, s in enumerate(suffixes):  # left-pad: the last column is every row's last context token
            ids[row, width - len(s) :] = torch.tensor(s)
            mask[row, prefix_len + width - len(s) :] = 1
            positions[row, width - len(s) :] = prefix_len + torch.arange(len(s))
        full_ids = torch.cat([torch.tensor(contexts[0][:prefix_len], dtype=torch.long).expand(b, -1), ids], 1).to(dev)
        mask, positions = mask.to(dev), positions.to(dev)
        cache = self._growing_cache(prefix, b)
        stop_ids = self.lm.stop_token_ids
        generated: list[list[int]] = [[] for _ in range(b)]
        hiddens: list[list[torch.Tensor]] = [[] for _ in range(b)]
        reasons = ["length"] * b
        texts = [""] * b
        done = [limit == 0 for limit in limits]
        active = list(range(b))  # batch position -> row: finished rows leave the batch (`_compactable`)
        compact = self.compact and _compactable(processors)
        step_ids, step_pos = ids.to(dev), positions
        nxt = None
        with torch.inference_mode():
            for t in range(max(limits)):
                hidden, cache = self._forward(step_ids, mask, step_pos, cache)
                last = hidden[:, -1].float()
                scores = geometry.logits(last.to(geometry.weight.device)).to(dev)
                scores = processors(full_ids, scores) if len(processors) else scores
                if sample:
                    probs = torch.softmax(scores, dim=-1)
                    nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                else:
                    nxt = scores.argmax(-1)
                for pos, row in enumerate(active):
                    if done[row]:
                        continue
                    token = int(nxt[pos])
                    if token in stop_ids:
                        done[row], reasons[row] = True, "eos"
                        continue
                    generated[row].append(token)
                    if keep_hidden:
                        hiddens[row].append(last[pos].cpu())
                    text = tok.decode(generated[row], skip_special_tokens=True)
                    text, stopped = cut_at_stop(text, stop)
                    if stopped:
                        done[row], reasons[row] = True, "stop"
                    elif len(generated[row]) >= limits[row]:
                        done[row] = True  # its own limit: reason stays "length"
                    texts[row] = text
                if on_step is not None:  # progress: rows finished, decoding steps done
                    on_step(sum(done), t + 1)
                if all(done):
                    break
                step_ids = nxt[:, None]
                full_ids = torch.cat([full_ids, step_ids], 1)
                mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=dev)], 1)
                step_pos = step_pos[:, -1:] + 1
                keep = [pos for pos, row in enumerate(active) if not done[row]]
                if compact and len(keep) < len(active):  # finished rows cost nothing from here on
                    index = torch.tensor(keep, device=dev)
                    for p in processors:
                        if isinstance(p, FollowsRows):
                            p.select_rows(index, nxt)
                    cache.batch_select_indices(index)
                    step_ids, full_ids, mask, step_pos = step_ids[index], full_ids[index], mask[index], step_pos[index]
                    active = [active[pos] for pos in keep]
        logs = [p.finalize(nxt[:, None]) for p in processors if isinstance(p, KeepsLogs) and nxt is not None]
        results = []
        for row in range(b):
            ends = [
                len(tok.decode(generated[row][: i + 1], skip_special_tokens=True)) for i in range(len(generated[row]))
            ]
            h = torch.stack(hiddens[row]) if hiddens[row] else torch.empty(0, geometry.hidden_size)
            steps = len(generated[row]) + (reasons[row] == "eos")  # steps this row really took
            row_logs = [log[row].truncate(steps) if isinstance(log[row], Truncatable) else log[row] for log in logs]
            results.append(GenerationResult(generated[row], texts[row], reasons[row], h, ends, row_logs))
        return results
