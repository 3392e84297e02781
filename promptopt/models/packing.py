"""An item's context run once for all its choices: the choices packed after it in one row, under a mask.

Without a few-shot prefix (0-shot HellaSwag: a ~50-token context, 4 endings of ~25 tokens) the prefix cache has
nothing to share, and scoring each (context + choice) input whole runs every context once per choice. Here the
inputs of one group (by default those with the same context; the scorer passes each request's item, so that
Winogrande's contexts, which differ after the blank, share what comes before it) are laid out in one row:

    [ the group's common token prefix | tail of input 1 | tail of input 2 | ... ]

with their true positions (each tail continues from the end of the common part), and a mask under which every
token sees what it would see in its own input: the common part causally, its own tail causally, never another
tail. Each choice's log-probs are then those of its own forward, up to float rounding (tests/models/test_packing.py
checks them against plain, uncached forwards). The common part is found in token space (the longest common prefix
of the group's fully tokenized inputs), as the few-shot prefix is, so no seam between context and choice can be
tokenized differently from a full-prompt run.

Packing is used where it pays and is exact: the model attends with sdpa over full-attention layers only (a
sliding window would need its own mask), and the items' shared parts are longer than the few-shot prefix (where
a prefix dominates, the prefix cache already removes most of the repeated work and the scorer's batches stay as
they were measured, bench/bench_scoring.py) and save at least a fifth of the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from promptopt import progress
from promptopt.models import last_layer

MIN_SAVING = 0.2  # of the tokens run after the prefix


@dataclass
class Group:
    key: int
    inputs: list[tuple[int, ...]]  # distinct inputs (context + continuation minus its last token)
    shared: int  # absolute length of their common token prefix


class PackingHost(Protocol):
    """What packing needs of the runner it packs for (models/runner.py Runner): its model and settings, and three
    hooks: the caches a scoring batch runs on, the last MLP it may run at read positions only, one forward."""

    lm: object  # models.load.LoadedModel
    batch_size: int
    progress: bool
    use_prefix_cache: bool
    share_item_contexts: bool

    @property
    def packable(self) -> bool: ...

    def scoring_caches(self, prefix, *, rows: int, width: int): ...

    def skippable_mlp(self) -> torch.nn.Module | None: ...

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> tuple: ...


def packable(lm) -> bool:
    """Whether a loaded model takes a packed row's mask exactly: sdpa attention, full-attention layers only."""
    from promptopt.models.attention import GROUPED_SDPA

    config = lm.model.config
    text = getattr(config, "get_text_config", lambda: config)()
    layer_types = getattr(text, "layer_types", None)
    full = all(t == "full_attention" for t in layer_types) if layer_types else not getattr(text, "sliding_window", None)
    return full and config._attn_implementation in ("sdpa", GROUPED_SDPA)


def plan(runner: PackingHost, requests, fed, prefix_len: int, groups) -> list[Group] | None:
    """The groups to pack, or None where packing is off, not exact for this model, or does not pay."""
    if not (runner.share_item_contexts and runner.use_prefix_cache) or not runner.packable:
        return None
    from promptopt.models.token_prefix import common_prefix_length

    keys = groups if groups is not None else [tuple(ctx) for ctx, _ in requests]
    members: dict[object, list[tuple[int, ...]]] = {}
    seen: set[tuple[int, ...]] = set()
    for key, seq in zip(keys, fed):
        if seq not in seen:  # an input two groups share is run in the first one's row
            seen.add(seq)
            members.setdefault(key, []).append(seq)
    out, saved, total, own = [], 0, 0, []
    for index, inputs in enumerate(members.values()):
        shared = max(common_prefix_length(inputs), prefix_len) if len(inputs) > 1 else len(inputs[0])
        total += sum(len(seq) - prefix_len for seq in inputs)
        if len(inputs) > 1:
            saved += (len(inputs) - 1) * (shared - prefix_len)
            own.append(shared - prefix_len)
        out.append(Group(index, inputs, shared))
    if not own or saved < MIN_SAVING * total or prefix_len >= sum(own) / len(own):
        return None
    return out


def _row(group: Group, prefix_len: int):
    """One group's packed row: ids, segment per token (0 the common part, i the i-th input's tail), positions, and
    where each input's tail starts in the row."""
    ids = list(group.inputs[0][prefix_len : group.shared])
    segment = [0] * len(ids)
    positions = list(range(prefix_len, group.shared))
    tail_at = {}
    for number, seq in enumerate(group.inputs, start=1):
        tail = seq[group.shared :]
        tail_at[seq] = len(ids)
        ids += tail
        segment += [number] * len(tail)
        positions += range(group.shared, group.shared + len(tail))
    return ids, segment, positions, tail_at


def _index(group: Group, tail_at: dict, seq: tuple[int, ...], position: int, prefix_len: int) -> int:
    """Where an input's absolute position sits in its group's packed row."""
    return position - prefix_len if position < group.shared else tail_at[seq] + position - group.shared


def _mask(segment: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """(rows, 1, width, prefix + width) booleans: the prefix, then the common part causally and the own tail
    causally; a padding position sees itself only (a row with nothing to attend to would give NaN)."""
    rows, width = segment.shape
    q, k = segment[:, :, None], segment[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = causal & (q >= 0) & (k >= 0) & ((k == 0) | (k == q))
    allowed |= torch.eye(width, dtype=torch.bool)
    return torch.cat([torch.ones(rows, width, prefix_len, dtype=torch.bool), allowed], dim=-1)[:, None]


def run(runner: PackingHost, groups: list[Group], first_needed: dict, prefix_len: int, prefix):
    """Run the packed rows, longest first, in batches of at most the tokens the unpacked widest batch would hold;
    return the hidden states every request reads (hidden_states.States)."""
    from tqdm.auto import tqdm

    from promptopt.models.hidden_states import States

    rows = sorted(((g, *_row(g, prefix_len)) for g in groups), key=lambda r: len(r[1]), reverse=True)
    budget = runner.batch_size * max(len(seq) - prefix_len for g in groups for seq in g.inputs)
    batches, current = [], []
    for row in rows:
        if current and (len(current) + 1) * len(current[0][1]) > budget:
            batches.append(current)
            current = []
        current.append(row)
    batches.append(current)
    pad = runner.lm.tokenizer.pad_token_id or 0
    dev = runner.lm.device
    cache_for = runner.scoring_caches(prefix, rows=max(map(len, batches)), width=len(rows[0][1]))
    states = States()
    meter, done = progress.meter("scoring", len(rows), "packed rows"), 0
    for batch in tqdm(batches, desc="scoring", disable=not runner.progress, leave=False):
        done += len(batch)
        width = len(batch[0][1])
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        segment = torch.full((len(batch), width), -1, dtype=torch.long)
        positions = torch.full((len(batch), width), prefix_len, dtype=torch.long)
        reads = []  # per row: (input, row indices of its read positions)
        for b, (group, row_ids, row_segment, row_positions, tail_at) in enumerate(batch):
            ids[b, : len(row_ids)] = torch.tensor(row_ids)
            segment[b, : len(row_ids)] = torch.tensor(row_segment)
            positions[b, : len(row_ids)] = torch.tensor(row_positions)
            for seq in group.inputs:
                at = [_index(group, tail_at, seq, p, prefix_len) for p in range(first_needed[seq], len(seq))]
                reads.append((b, group, seq, torch.tensor(at, dtype=torch.long)))
        mlp, read = runner.skippable_mlp(), None
        if mlp is not None:  # each position read once, though several inputs read the common part
            read = torch.cat([b * width + at for b, _, _, at in reads]).unique().to(dev)
        mask = _mask(segment, prefix_len)
        with torch.inference_mode(), last_layer.mlp_only_at(mlp, read):
            hidden, _ = runner.forward(ids.to(dev), mask.to(dev), positions.to(dev), cache_for(len(batch)))
        for b, group, seq, at in reads:
            states.add(seq, first_needed[seq], hidden[b, at.to(dev)].float().clone(), group.key, group.shared)
        meter.update(done)
    return states
