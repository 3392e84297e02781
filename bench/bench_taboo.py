"""Benchmark 4: per-token overhead of taboo decoding vs plain greedy `model.generate` on the embedded
model (same prompt, exactly the same number of new tokens, EOS disabled). Target: ≤ 5%.
Also the same ratio inside promptopt's own decoding loop."""

from __future__ import annotations

import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
TOKENS = int(os.environ.get("BENCH_TOKENS", "96"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def main() -> None:
    import torch
    from transformers import LogitsProcessorList

    from promptopt.models import Runner, load_model
    from promptopt.robustness import TabooLogitsProcessor, word_initial_mask

    torch.set_num_threads(2)
    lm = load_model("smollm2-135m-instruct", device="cpu")
    mask = word_initial_mask(lm.tokenizer, lm.output_head.vocab_size)
    text = "Question: Janet's ducks lay 16 eggs per day. She eats three for breakfast. How many are left?\nAnswer:"
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])

    def hf(processor):
        kwargs = {"logits_processor": LogitsProcessorList([processor])} if processor else {}
        start = time.perf_counter()
        with torch.no_grad():
            out = lm.model.generate(
                ids,
                max_new_tokens=TOKENS,
                min_new_tokens=TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=lm.tokenizer.pad_token_id,
                **kwargs,
            )
        assert out.shape[1] - ids.shape[1] == TOKENS
        return time.perf_counter() - start

    hf(None)  # warm-up
    plain, taboo, interventions = [], [], 0
    for _ in range(ROUNDS):  # interleaved, best of N: robust to a noisy machine
        plain.append(hf(None))
        proc = TabooLogitsProcessor(mask, rank=1)
        taboo.append(hf(proc))
        interventions = proc.logs[0].interventions if proc.logs else 0
    ratio = min(taboo) / min(plain)
    print(
        f"[4a] model.generate, {TOKENS} tokens: plain {min(plain) / TOKENS * 1e3:.1f} ms/token, "
        f"taboo i=1 {min(taboo) / TOKENS * 1e3:.1f} ms/token ({interventions} interventions) -> overhead {(ratio - 1) * 100:+.2f}% "
        f"(target ≤ 5%: {'met' if ratio <= 1.05 else 'NOT met'})"
    )

    runner = Runner(lm, batch_size=1)
    context = ids[0].tolist()

    def ours(with_taboo):
        factory = (lambda: TabooLogitsProcessor(mask, rank=1)) if with_taboo else None
        start = time.perf_counter()
        gen = runner.generate([context], max_new_tokens=TOKENS, processor_factory=factory)[0]
        return (time.perf_counter() - start) / max(1, len(gen.tokens))

    ours(False)
    plain_ours = min(ours(False) for _ in range(ROUNDS))
    taboo_ours = min(ours(True) for _ in range(ROUNDS))
    print(
        f"[4b] promptopt decoding loop: plain {plain_ours * 1e3:.1f} ms/token, taboo {taboo_ours * 1e3:.1f} ms/token "
        f"-> overhead {(taboo_ours / plain_ours - 1) * 100:+.2f}% (per generated token; sequences may stop at EOS)"
    )


if __name__ == "__main__":
    main()
