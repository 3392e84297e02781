"""Generation: greedy or sampled decoding with logits processors, stop strings and per-row limits, on top of the
runner's shared-prefix KV cache; finished rows leave the batch when the processors allow it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from promptopt import progress


def _compactable(processors) -> bool:
    """Finished rows may leave a batch when every processor is stateless across rows (temperature, top-p) or
    follows them (`select_rows(index, chosen)`, like TabooLogitsProcessor)."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    return all(
        hasattr(p, "select_rows") or isinstance(p, (TemperatureLogitsWarper, TopPLogitsWarper)) for p in processors
    )


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


class GenerationMixin:
    """`Runner.generate` (runner.py holds the prefix cache and the forward it uses)."""

    def generate(
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
        fresh one for each batch; a processor with a `finalize(output_ids)` method returns per-row logs,
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
                        if hasattr(p, "select_rows"):
                            p.select_rows(index, nxt)
                    cache.batch_select_indices(index)
                    step_ids, full_ids, mask, step_pos = step_ids[index], full_ids[index], mask[index], step_pos[index]
                    active = [active[pos] for pos in keep]
        logs = [p.finalize(nxt[:, None]) for p in processors if hasattr(p, "finalize") and nxt is not None]
        results = []
        for row in range(b):
            ends = [
                len(tok.decode(generated[row][: i + 1], skip_special_tokens=True)) for i in range(len(generated[row]))
            ]
            h = torch.stack(hiddens[row]) if hiddens[row] else torch.empty(0, geometry.hidden_size)
            steps = len(generated[row]) + (reasons[row] == "eos")  # steps this row really took
            row_logs = [log[row].truncate(steps) if hasattr(log[row], "truncate") else log[row] for log in logs]
            results.append(GenerationResult(generated[row], texts[row], reasons[row], h, ends, row_logs))
        return results
