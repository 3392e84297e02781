"""The contract between a model and what scores with it (lm-eval states the same in lm_eval/api/model.py).

A scorer needs two things of a runner: the log-likelihood of continuations given contexts, in token ids (with
δ_TCB at the critical state when asked), and generation with logits processors (taboo decoding is one). `Runner` is
the implementation; anything with these members (a remote model, a mock in a test) can stand in for it, and the
Python API takes one as `model=` (docs/python-api.md). The signatures are what promptopt calls them with
(tests/test_architecture.py checks every call in the package against them, and `Runner` against them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from promptopt.models.load import LoadedModel
from promptopt.models.runner import GenerationResult, LoglikelihoodResult


@runtime_checkable
class ModelRunner(Protocol):
    lm: LoadedModel  # tokenizer, output head (δ_TCB reads W), context length, name
    batch_size: int

    def loglikelihood(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        tcb_targets: Sequence[int] | None = None,
        eps: float = 1.0,
        groups: Sequence | None = None,
    ) -> list[LoglikelihoodResult]:
        """Per (context ids, continuation ids): Σ log p, per-token log p, greedy flag, and the final hidden
        state at the position that predicts the first continuation token.

        `tcb_targets` (one token id per request, or None): also fill each result's `tcb` with δ_TCB and its
        companions at that state aimed at that token, `lm.output_head(hidden, eps=eps, target=...)`'s fields
        (`TCBResult.to_dict()`) as numbers. `groups` (one key per request, or None): requests with the same key
        share their context (an item's choices), which a runner may run once; it never changes a result."""
        ...

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
        """Continue each context until EOS, a stop string or its token limit."""
        ...
