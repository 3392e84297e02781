"""Taboo stress of a prompt on a generative task (Taboo paper §3.4): how much reasoning survives when
the model's preferred word-initial tokens are forbidden.

Per taboo rank i: Acc_taboo; conditional retention R = P(correct under taboo | correct at baseline) with
a 95% Wilson interval on |Q_correct|; marginal retention Acc_taboo / Acc_base; injected surprisal
(S_total per item, mean ΔS per intervention, bits); interventions per item; answer-length expansion
(mean generated tokens under taboo / at baseline).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from promptopt import progress
from promptopt.errors import UserError
from promptopt.metrics.stats import wilson_interval
from promptopt.prompts import Prompt
from promptopt.robustness.taboo import TabooLogitsProcessor, mid_word_masks, word_initial_mask
from promptopt.scoring import PromptScorer
from promptopt.tasks import Item


@dataclass
class StressResult:
    summary: pd.DataFrame  # one row per rank
    items: pd.DataFrame  # one row per (rank, item)


def _run(scorer: PromptScorer, prompt: Prompt, items: list[Item], *, factory, temperature: float, seed: int):
    judged = scorer.generate_answers(
        prompt, items, processor_factory=factory, temperature=temperature, seed=seed, keep_hidden=False
    )
    rows = []
    for item, (gen, (answer, _, correct)) in zip(items, judged):
        log = gen.processor_logs[0] if gen.processor_logs else None
        rows.append(
            {
                "item_id": item.id,
                "correct": bool(correct),
                "pred": answer,
                "generated_tokens": len(gen.tokens),
                "interventions": log.interventions if log else 0,
                "surprisal_bits": log.total_bits if log else 0.0,
                "output": gen.text,
            }
        )
    return pd.DataFrame(rows)


def taboo_stress(
    scorer: PromptScorer,
    prompt: Prompt,
    items: list[Item],
    *,
    ranks: tuple[int, ...] = (1, 2, 4, 8),
    mode: str = "word_initial",
    temperature: float = 0.0,
    seed: int = 0,
    store: MutableMapping[int, pd.DataFrame] | None = None,
) -> StressResult:
    """Baseline decoding, then taboo decoding at each rank, on the same items with the same settings.

    `store` (rank -> per-item rows, 0 = baseline) keeps finished conditions: a condition found there for
    the same items is not decoded again, and each new one is put there as soon as it is done, so a sweep
    resumed after a crash loses at most the condition it was running."""
    if not scorer.data.spec.generative:
        raise UserError(
            f"taboo stress needs a generative task (answer type number, alias_match, multiple_choice_gen or code); "
            f"{scorer.data.spec.name} is scored by log-likelihood"
        )
    if not items:
        raise UserError("no items to stress")
    vocab = scorer.lm.output_head.vocab_size
    mask = word_initial_mask(scorer.lm.tokenizer, vocab)
    continues, glues = mid_word_masks(scorer.lm.tokenizer, vocab) if mode == "mid_word" else (None, None)
    store = {} if store is None else store
    ids = [item.id for item in items]

    conditions, took = 1 + len(ranks), []  # the baseline and each rank; seconds of each condition decoded here

    def condition(rank: int, factory) -> pd.DataFrame:
        done = store.get(rank)
        number = 1 + (ranks.index(rank) + 1 if rank else 0)
        name = f"rank {rank}" if rank else "baseline"
        if done is not None:
            if done["item_id"].astype(str).tolist() != ids:
                raise UserError(f"the stored rank-{rank} condition was run on other items; it is not mixed with these")
            progress.step(f"{name} ({number}/{conditions}): kept from an earlier run")
            return done
        left = conditions - number + 1
        estimate = (
            f"; about {progress.duration(sum(took) / len(took) * left)} left for {left} condition{'s' if left > 1 else ''}"
            " at the pace so far"
            if took
            else ""
        )
        progress.step(f"{name} ({number}/{conditions}): decoding {len(items)} items{estimate}")
        start = time.perf_counter()
        with progress.stage(f"{name} ({number}/{conditions})"):
            store[rank] = _run(scorer, prompt, items, factory=factory, temperature=temperature, seed=seed)
        took.append(time.perf_counter() - start)
        progress.step(f"{name} ({number}/{conditions}) done in {progress.duration(took[-1])}")
        return store[rank]

    base = condition(0, None)
    base_correct = base["correct"].to_numpy()
    frames = [base.assign(rank=0)]
    summary = [condition_summary(0, base, base_correct, base)]
    for rank in ranks:
        taboo = condition(
            rank, lambda r=rank: TabooLogitsProcessor(mask, r, mode=mode, continues=continues, glues=glues)
        )
        frames.append(taboo.assign(rank=rank))
        summary.append(condition_summary(rank, taboo, base_correct, base))
    return StressResult(pd.DataFrame(summary), pd.concat(frames, ignore_index=True))


def condition_summary(rank: int, run: pd.DataFrame, base_correct: np.ndarray, base: pd.DataFrame) -> dict:
    """One rank's row of the stress table, from its per-item rows and the baseline's."""
    correct = run["correct"].to_numpy()
    n_base = int(base_correct.sum())
    kept = int((correct & base_correct).sum())
    low, high = wilson_interval(kept, n_base)
    acc_base = float(base_correct.mean())
    interventions = int(run["interventions"].sum())
    base_len = float(base["generated_tokens"].mean())
    return {
        "rank": rank,
        "n": len(run),
        "accuracy": float(correct.mean()),
        "retention": kept / n_base if n_base else float("nan"),  # undefined without baseline-correct items
        "retention_ci_low": low,
        "retention_ci_high": high,
        "n_base_correct": n_base,
        "marginal_retention": float(correct.mean()) / acc_base if acc_base > 0 else float("nan"),
        "surprisal_total_per_item": float(run["surprisal_bits"].mean()),
        "mean_surprisal_per_intervention": float(run["surprisal_bits"].sum()) / interventions if interventions else 0.0,
        "interventions_per_item": interventions / len(run),
        "length_expansion": float(run["generated_tokens"].mean()) / base_len if base_len > 0 else float("nan"),
    }
