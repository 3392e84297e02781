"""Log-likelihood scoring: log p(continuation | context) per request, the hidden state and δ_TCB at the position
that predicts each continuation's first token, with one batched projection through the output head.

Every prompt of a study repeats the same instruction and exemplar block before each item: that prefix is found in
token space and run once (runner.py, prefix_cache.py). Where there is no such prefix (0-shot), the contexts an
item's choices share are run once instead (packing.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from promptopt import progress
from promptopt.models import last_layer


@dataclass
class LoglikelihoodResult:
    logprob: float  # Σ log p(continuation | context)
    token_logprobs: list[float]
    is_greedy: bool  # every continuation token was the argmax
    hidden: torch.Tensor  # final hidden state at the position that predicts the first continuation token
    tcb: dict | None = None  # δ_TCB and its companions there (TCBResult's fields as numbers), when asked for


class States:
    """The final hidden states a call reads: per input, its rows from its first read position on; positions that a
    group of inputs shares (packing.py) carry the group's key, so requests reading them share one projection."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, ...], tuple[int, torch.Tensor]] = {}  # input -> (first position, its rows)
        self._shared: dict[tuple[int, ...], tuple[object, int]] = {}  # input -> (group key, shared length)

    def add(self, seq: tuple[int, ...], first: int, rows: torch.Tensor, group=None, shared: int = 0) -> None:
        self._rows[seq] = (first, rows)
        if group is not None:
            self._shared[seq] = (group, shared)

    def at(self, seq: tuple[int, ...], position: int) -> torch.Tensor:
        first, rows = self._rows[seq]
        return rows[position - first]

    def key(self, seq: tuple[int, ...], position: int) -> tuple:
        group, shared = self._shared.get(seq, (None, 0))
        return ("group", group, position) if position < shared else ("input", seq, position)


class LoglikelihoodMixin:
    """`Runner.loglikelihood` (runner.py holds the prefix cache and the forward it uses)."""

    def loglikelihood(
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
        """Every distinct input after the prefix as its own row, longest first, in batches of `batch_size` rows."""
        from tqdm.auto import tqdm

        states = States()
        order = sorted(unique, key=len, reverse=True)
        pad = self.lm.tokenizer.pad_token_id or 0
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        cache_for = self._scoring_caches(prefix, rows=len(batches[0]), width=len(order[0]) - prefix_len)
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
            mlp, read = self._skippable_mlp(), None
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
