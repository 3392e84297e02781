"""Decoding-level Taboo (Taboo paper §2): at word-initial steps, mask the model's top-i candidates.

At step t, if the *nominal* top candidate is word-initial, the i highest logits are set to −inf and
decoding (greedy or sampled) continues from the rest; otherwise nothing changes. The injected surprisal

    ΔS_t = log2 P_nom(x_nom) − log2 P_nom(x*) ≥ 0   (bits, under the unmasked distribution)

is logged per sequence. x* is whatever token was actually emitted, read from `input_ids` at the next call
(or by `finalize`), so greedy and sampling share one code path.

Mid-word ablation (the paper's §2.2 control) masks the top-i only where the nominal top candidate
*continues a word*: a mode, not a separate implementation. "Continues a word" is decided per tokenizer by
`mid_word_masks`: the nominal token (a) is not a special token (EOS, chat markers), (b) carries no
word-boundary marker, (c) decodes to text whose first character is a letter — so whitespace and newline
pieces, punctuation and digits never count (a digit may start a number: "Ġ","4","2" is how SmolLM2 writes
" 42") — and (d) the previous token's text ends in a letter, so the piece really glues onto a word (after
"\n" a marker-less "The" starts a word). Masking anything else would be tokenization noise of another kind:
the old rule "not word-initial" also fired on EOS, newlines, digits and punctuation, and could mask EOS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

_LOG2E = 1.0 / math.log(2.0)


def word_initial_mask(tokenizer, vocab_size: int | None = None) -> torch.Tensor:
    """Boolean mask over the vocabulary: tokens that start a new word.

    Byte-level BPE marks a leading space with 'Ġ', SentencePiece with '▁'; other tokenizers fall back to
    decoding each token and checking for a leading space. Special tokens are never word-initial.
    """
    size = vocab_size or len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(size, len(tokenizer)))))
    special = set(tokenizer.all_special_ids)
    strings = [t if isinstance(t, str) else "" for t in tokens]
    n_bpe = sum(s.startswith("Ġ") for s in strings)
    n_sp = sum(s.startswith("▁") for s in strings)
    if max(n_bpe, n_sp) >= 0.05 * len(strings):
        marker = "Ġ" if n_bpe >= n_sp else "▁"
        flags = [s.startswith(marker) for s in strings]
    else:
        flags = [tokenizer.decode([i]).startswith(" ") for i in range(len(strings))]
    mask = torch.zeros(size, dtype=torch.bool)
    mask[: len(flags)] = torch.tensor(flags, dtype=torch.bool)
    for i in special:
        if i < size:
            mask[i] = False
    return mask


def mid_word_masks(tokenizer, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(continues, glues) boolean masks over the vocabulary for the mid-word ablation.

    continues[i]: token i can only continue a word — not special, not word-initial (`word_initial_mask`),
    and its decoded text starts with a letter. glues[i]: token i's decoded text ends with a letter, so a
    `continues` piece emitted right after it extends the same word.
    """
    size = vocab_size or len(tokenizer)
    n = min(size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
    special = {i for i in tokenizer.all_special_ids if i < size}
    starts = torch.zeros(size, dtype=torch.bool)
    ends = torch.zeros(size, dtype=torch.bool)
    starts[:n] = torch.tensor([bool(t) and t[0].isalpha() for t in texts], dtype=torch.bool)
    ends[:n] = torch.tensor([bool(t) and t[-1].isalpha() for t in texts], dtype=torch.bool)
    for i in special:
        starts[i] = ends[i] = False
    return starts & ~word_initial_mask(tokenizer, size), ends


@dataclass
class TabooLog:
    """What happened to one sequence: per intervened step, its index and ΔS in bits."""

    steps: list[int] = field(default_factory=list)
    delta_bits: list[float] = field(default_factory=list)

    def truncate(self, n_steps: int) -> TabooLog:
        keep = [i for i, s in enumerate(self.steps) if s < n_steps]
        return TabooLog([self.steps[i] for i in keep], [self.delta_bits[i] for i in keep])

    @property
    def interventions(self) -> int:
        return len(self.steps)

    @property
    def total_bits(self) -> float:
        return float(sum(self.delta_bits))


def _padded(mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The mask on the scores' device, padded to their width (padded embedding rows never trigger)."""
    mask = mask.to(scores.device)
    if mask.shape[0] < scores.shape[1]:
        mask = torch.cat([mask, mask.new_zeros(scores.shape[1] - mask.shape[0])])
    return mask


class TabooLogitsProcessor:
    """A transformers LogitsProcessor (callable on (input_ids, scores)) that applies the taboo mask.

    Usable with `model.generate(logits_processor=LogitsProcessorList([proc]))` and with promptopt's own
    decoding loop. After generation, call `finalize(output_ids)` to account for the last step, then read
    `logs[row]`. One processor serves one batch of sequences; call `reset()` before reusing it.
    """

    def __init__(
        self,
        word_initial: torch.Tensor,
        rank: int = 1,
        *,
        mode: str = "word_initial",
        continues: torch.Tensor | None = None,
        glues: torch.Tensor | None = None,
    ) -> None:
        """mode "mid_word" needs `continues` (and, to check the previous token, `glues`) from `mid_word_masks`."""
        if rank < 1:
            raise ValueError(f"taboo rank must be >= 1, got {rank}")
        if mode not in ("word_initial", "mid_word"):
            raise ValueError(f"mode must be word_initial or mid_word, got {mode!r}")
        if mode == "mid_word" and continues is None:
            raise ValueError("mode mid_word needs the `continues` mask (and `glues`): see mid_word_masks(tokenizer)")
        self.word_initial = word_initial.bool()
        self.continues = None if continues is None else continues.bool()
        self.glues = None if glues is None else glues.bool()
        self.rank = rank
        self.mode = mode
        self.reset()

    def reset(self) -> None:
        self.logs: list[TabooLog] = []
        self._rows: list[int] | None = None  # batch position -> sequence, once finished rows have left the batch
        self._step = 0
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = (
            None  # positions, nominal logp, nominal id
        )

    def _settle(self, chosen: torch.Tensor) -> None:
        """Record ΔS for the interventions of the previous step, now that the emitted tokens are known."""
        if self._pending is None:
            return
        positions, logp, nominal = self._pending
        picked = chosen[positions].to(logp.device)
        delta = (logp.gather(1, nominal[:, None]) - logp.gather(1, picked[:, None])).squeeze(1) * _LOG2E
        for pos, value in zip(positions.tolist(), delta.clamp_min(0.0).tolist()):
            row = pos if self._rows is None else self._rows[pos]
            self.logs[row].steps.append(self._step - 1)
            self.logs[row].delta_bits.append(value)
        self._pending = None

    def select_rows(self, index: torch.Tensor, chosen: torch.Tensor) -> None:
        """The decoding loop keeps only the batch positions `index` (finished rows left); `chosen` holds the
        tokens just emitted in the old layout, which settle this step's interventions first."""
        self._settle(chosen)
        current = self._rows if self._rows is not None else list(range(len(self.logs)))
        self._rows = [current[i] for i in index.tolist()]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        batch = scores.shape[0]
        while len(self.logs) < batch:
            self.logs.append(TabooLog())
        if self._step > 0:
            self._settle(input_ids[:, -1])
        nominal = scores.argmax(-1)
        if self.mode == "word_initial":
            trigger = _padded(self.word_initial, scores)[nominal]
        else:
            trigger = _padded(self.continues, scores)[nominal]
            if self.glues is not None and input_ids.shape[1] > 0:
                trigger = trigger & _padded(self.glues, scores)[input_ids[:, -1].to(scores.device)]
        rows = trigger.nonzero().squeeze(1)
        if rows.numel():
            logp = torch.log_softmax(scores[rows].float(), dim=-1)
            self._pending = (rows, logp, nominal[rows])
            top = scores[rows].topk(self.rank, dim=-1).indices
            scores = scores.clone()
            scores[rows[:, None], top] = float("-inf")
        self._step += 1
        return scores

    def finalize(self, output_ids: torch.Tensor) -> list[TabooLog]:
        """Account for the last step's interventions (the emitted tokens are the last column)."""
        if self._pending is not None:
            self._settle(output_ids[:, -1])
        return self.logs
