"""Benchmark 6: LM-paraphrase generation, the robustness phase's largest single cost on a CPU.

Two changes, each a ratio against the old path measured in the same run on the embedded model:
- the output-head product as W·hᵀ instead of h·Wᵀ at 1–256 rows (same products in another layout, which
  BLAS runs faster when h has few rows, as at every decoding step; `OutputGeometry.logits` uses it below
  128 rows), with the largest difference between the two;
- paraphrase requests generated at 4× the runner's batch size with a per-row token limit (old: the runner's
  batch size and one limit, that of the longest question, for the whole call), with the texts compared.
"""

from __future__ import annotations

import os
import time

import torch
from bench_tcb import best_of  # this folder is on sys.path when a bench script runs

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    from promptopt.models import Runner, load_model
    from promptopt.robustness.perturb import LMParaphraseOperator
    from promptopt.tasks import load_task

    lm = load_model("smollm2-135m-instruct", device="cpu")
    head = lm.output_head
    print(f"output head (vocab × d = {head.vocab_size} × {head.hidden_size}), float32 logits for N hidden states:")
    for rows in (1, 16, 64, 256):
        h = torch.randn(rows, head.hidden_size)
        old = best_of(lambda h=h: h @ head.weight.T)
        new = best_of(lambda h=h: (head.weight @ h.T).T)
        diff = float(((head.weight @ h.T).T - h @ head.weight.T).abs().max())
        print(
            f"  N={rows:4d}: h·Wᵀ {old * 1e3:7.1f} ms  W·hᵀ {new * 1e3:7.1f} ms  speed-up {old / new:4.2f}×  max |Δ| {diff:.1e}"
        )

    items = load_task("sst2").test[:100]
    op = LMParaphraseOperator()
    style = op.STYLES[0]
    contexts = [op._request(lm, style, item.question) for item in items]
    own = [len(ids) for ids in lm.tokenizer([item.question for item in items])["input_ids"]]
    runner = Runner(lm, batch_size=16)
    start = time.perf_counter()
    before = runner.generate(contexts, max_new_tokens=op.token_limit(max(own)), stop=["\n\n"], keep_hidden=False)
    old = time.perf_counter() - start
    start = time.perf_counter()
    after = runner.generate(
        contexts,
        max_new_tokens=[op.token_limit(n) for n in own],
        stop=["\n\n"],
        keep_hidden=False,
        batch_size=4 * runner.batch_size,
    )
    new = time.perf_counter() - start
    same = sum(a.text == b.text for a, b in zip(before, after))
    capped = sum(len(a.tokens) > op.token_limit(n) for a, n in zip(before, own))
    print(f"LM paraphrase of {len(items)} SST-2 test questions (one style, greedy):")
    print(
        f"  batch {runner.batch_size}, one limit: {old:6.1f} s   batch {4 * runner.batch_size}, per-row limits: {new:6.1f} s   speed-up {old / new:4.2f}×"
    )
    print(
        f"  identical texts {same}/{len(items)}; {capped} old rows ran past their own question's limit (cut there now)"
    )


if __name__ == "__main__":
    main()
