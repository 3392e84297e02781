"""Where scoring batches are cut (promptopt/models/length_batches.py), against fixed chunks of the batch size, in
one run: the scorer's answers (scoring/card_answers.py's answer_table, what export, verify and serve run) for N
SST-2 test inputs under SST-2's default 4-shot prompt, on the embedded model, CPU.

Two shapes: the N inputs in one call, and in calls of W (what a server whose clients keep W requests in flight can
batch at most). Each round times both cuts on both shapes, the cut that goes first alternating by round; the ratio
printed is cost-cut time over fixed-chunk time, paired by round, its median and the median's distribution-free
interval (this machine drifts by ±10% within a minute, more than the effect). Below 1: the cost cuts are faster.
The two cuts' predictions must agree item by item (float rounding aside, they are the same numbers): the run
stops if they do not.

    .venv/bin/python bench/bench_length_batches.py   # BENCH_ITEMS=64 BENCH_WINDOW=32 BENCH_ROUNDS=12
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ITEMS = int(os.environ.get("BENCH_ITEMS", "64"))
WINDOW = int(os.environ.get("BENCH_WINDOW", "32"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "12"))


def main() -> None:
    import torch

    from promptopt.decision import DecisionRule
    from promptopt.metrics.stats import median_interval
    from promptopt.models import load_model
    from promptopt.models.length_batches import CPU_FORWARD_TOKENS
    from promptopt.scoring import Scorer
    from promptopt.scoring.card_answers import CardMember, answer_table
    from promptopt.tasks import load_task

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", str(os.cpu_count() or 2))))
    lm = load_model("smollm2-135m-instruct", device="cpu")
    task = load_task("sst2")
    items = task.test[:ITEMS]
    scorer = Scorer(lm, task, batch_size=16)
    members = [CardMember(prompt=task.default_prompt(), rule=DecisionRule())]
    runner = scorer.runner
    answer_table(scorer, members, items[:8])  # warm-up: the prefix cache, the output head's statistics

    def timed(window: int):
        start = time.perf_counter()
        tables = [answer_table(scorer, members, items[a : a + window]) for a in range(0, len(items), window)]
        return time.perf_counter() - start, [int(p) for t in tables for p in t["pred"]]

    times = {(cut, shape): [] for cut in ("cost", "fixed") for shape in ("one call", f"calls of {WINDOW}")}
    preds = {}
    for r in range(ROUNDS):
        for cut in ("cost", "fixed") if r % 2 == 0 else ("fixed", "cost"):
            runner.forward_overhead_tokens = CPU_FORWARD_TOKENS if cut == "cost" else None
            for shape, window in (("one call", len(items)), (f"calls of {WINDOW}", WINDOW)):
                seconds, preds[cut, shape] = timed(window)
                times[cut, shape].append(seconds)
    print(
        f"{ITEMS} SST-2 test items, default 4-shot prompt, argmax, batch size 16, CPU threads "
        f"{torch.get_num_threads()}, {ROUNDS} rounds; a forward's cost {CPU_FORWARD_TOKENS:g} tokens"
    )
    for shape in ("one call", f"calls of {WINDOW}"):
        ratios = [c / f for c, f in zip(times["cost", shape], times["fixed", shape])]
        low, high, coverage = median_interval(ratios)
        same = sum(a == b for a, b in zip(preds["cost", shape], preds["fixed", shape]))
        if same != len(items):
            raise SystemExit(f"{shape}: the cuts disagree on {len(items) - same} of {len(items)} predictions")
        print(
            f"{shape:>12}: fixed chunks {statistics.median(times['fixed', shape]):.3f} s, cost cuts "
            f"{statistics.median(times['cost', shape]):.3f} s (medians); cost / fixed paired "
            f"{statistics.median(ratios):.3f} [{low:.3f}, {high:.3f}] ({coverage:.0%} interval); predictions "
            f"agree on {same}/{len(items)}"
        )


if __name__ == "__main__":
    main()
