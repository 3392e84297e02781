"""Benchmark 1: δ_TCB's closed form vs the explicit V×d Jacobian, and δ_TCB's share of per-item scoring
time on the prefix-cached path (SST-2 4-shot: ~30 suffix tokens run per item, one critical state each).

Every number is a ratio against a baseline measured in the same run. Target: share ≤ 5%.
"""

from __future__ import annotations

import os
import time

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def best_of(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def explicit_jacobian_norm(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The baseline: build J = (diag(o) − o oᵀ) W (V×d, float32) for each position and take its norm."""
    out = []
    for h in hidden:
        o = torch.softmax(weight @ h, -1)
        jac = o[:, None] * weight - o[:, None] * (o @ weight)[None, :]
        out.append(torch.linalg.matrix_norm(jac))
    return torch.stack(out)


def main() -> None:
    from promptopt.models import load_model
    from promptopt.models.runner import common_prefix_length
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    torch.set_num_threads(2)
    lm = load_model("smollm2-135m-instruct", device="cpu")
    weight = lm.model.get_output_embeddings().weight.detach()
    task = load_task("sst2")
    items = task.dev[:64]
    scorer = Scorer(lm, task, batch_size=16)
    prompt = task.default_prompt()
    scorer.score(prompt, items[:8])  # warm-up: prefix cache, allocator

    # critical states of real items
    tok = lm.tokenizer
    contexts = [prompt.context(i.question, i.choices) for i in items]
    ids = [tok(c)["input_ids"] for c in contexts]
    results = scorer.runner.loglikelihood(
        [(c, tok(ctx + " negative")["input_ids"][len(c) :]) for c, ctx in zip(ids, contexts)]
    )
    hidden = torch.stack([r.hidden for r in results])

    n_explicit = 16
    t_closed = best_of(lambda: lm.output_head(hidden[:n_explicit]))
    t_explicit = best_of(lambda: explicit_jacobian_norm(hidden[:n_explicit], weight), repeats=1)
    with torch.no_grad():
        agree = torch.allclose(
            lm.output_head(hidden[:n_explicit]).jacobian_norm.float(),
            explicit_jacobian_norm(hidden[:n_explicit], weight),
            rtol=1e-3,
        )
    print(
        f"[1a] closed form vs explicit V×d Jacobian ({n_explicit} positions, V={lm.output_head.vocab_size}, d={lm.output_head.hidden_size})"
    )
    print(
        f"     explicit {t_explicit * 1e3 / n_explicit:.1f} ms/position, closed form {t_closed * 1e3 / n_explicit:.2f} ms/position"
    )
    print(f"     speed-up {t_explicit / t_closed:.1f}x   (agree within 1e-3: {agree})")

    t_score = best_of(lambda: scorer.score(prompt, items))
    targets = [tok(" negative")["input_ids"][0]] * len(items)
    t_tcb = best_of(lambda: scorer._tcb(hidden, targets))
    suffix = sum(len(i) for i in ids) / len(ids) - common_prefix_length(ids)
    print(
        f"[1b] δ_TCB share of prefix-cached scoring, SST-2 4-shot, {len(items)} items (~{suffix:.0f} suffix tokens/item)"
    )
    print(
        f"     scoring {t_score / len(items) * 1e3:.1f} ms/item (δ_TCB included), δ_TCB {t_tcb / len(items) * 1e3:.2f} ms/item"
    )
    share = t_tcb / t_score
    print(f"     share {share * 100:.2f}%  (target ≤ 5%: {'met' if share <= 0.05 else 'NOT met'})")


if __name__ == "__main__":
    main()
