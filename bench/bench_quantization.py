"""What 4-bit and 8-bit weights do to the numbers a user decides on: the embedded SmolLM2 in float32, 8-bit (LLM.int8)
and 4-bit (NF4, double quantization, float32 compute), through bitsandbytes on this machine's device.

For each task (SST-2: 200 test items; ARC-Easy: 100 test items; the task's own prompt), each quantized load against
float32 on the same items:
- decision agreement: the share of items whose answer is the same (Wilson 95% interval);
- the paired accuracy difference (quantized − float32) with its item-bootstrap 95% interval and the exact McNemar p;
- δ_TCB's relative difference |δ_q − δ_32| / δ_32 at each item's critical point: median and worst;
- a small compare: K prompts drawn from the task's search space (one seeded random draw, the same prompts for every
  precision) scored on dev items; the winner is the best dev accuracy (ties: the earlier draw). Said: whether the
  winner is float32's, and the Spearman correlation of the K dev accuracies with float32's.

    nice -n 10 python bench/bench_quantization.py [--out bench/quantization.json]

Sizes: BENCH_SST2_ITEMS (200), BENCH_ARC_ITEMS (100), BENCH_CANDIDATES (6), BENCH_DEV_ITEMS (100),
BENCH_PRECISIONS (float32,8bit,4bit), BENCH_DEVICE (cpu). One process loads each precision in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
from promptopt.cli.app import huge_pages_for_large_tensors, quiet_libraries  # noqa: E402  (before torch)

huge_pages_for_large_tensors()

TASKS = {
    "sst2": int(os.environ.get("BENCH_SST2_ITEMS", "200")),
    "arc_easy": int(os.environ.get("BENCH_ARC_ITEMS", "100")),
}
CANDIDATES = int(os.environ.get("BENCH_CANDIDATES", "6"))
DEV_ITEMS = int(os.environ.get("BENCH_DEV_ITEMS", "100"))
PRECISIONS = os.environ.get("BENCH_PRECISIONS", "float32,8bit,4bit").split(",")
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")
MODEL = os.environ.get("BENCH_MODEL", "smollm2-135m-instruct")
SEED = 1234


def candidate_prompts(task: str, data, k: int) -> list:
    """K prompts from the task's built-in search space: one seeded random draw of its parameters each."""
    import optuna

    from promptopt.study.space import load_space

    space = load_space(task)
    pool = space.check_against(data)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=SEED))
    prompts, seen = [], set()
    while len(prompts) < k:
        trial = study.ask()
        prompt = space.suggest(trial, pool, data.spec, decision="argmax")
        key = json.dumps(prompt.to_card(), sort_keys=True)
        study.tell(trial, 0.0)
        if key not in seen:
            seen.add(key)
            prompts.append(prompt)
    return prompts


def score_precision(precision: str, tasks: dict) -> dict:
    """Per task: the test table's pred, correct, δ_TCB; each candidate's dev correctness; seconds."""
    import gc

    from promptopt.models.load import ModelConfig, precision_name, quantization_info
    from promptopt.scoring import Scorer
    from promptopt.tasks.data import DataConfig

    quantize = None if precision == "float32" else precision
    out: dict = {"precision": precision, "tasks": {}}
    start = time.perf_counter()
    lm = ModelConfig(spec=MODEL, device=DEVICE, dtype="float32", quantize=quantize).load()
    out["loaded"] = precision_name("float32", quantization_info(lm.model))
    for task, n_items in tasks.items():
        data = DataConfig(task=task).load()
        scorer = Scorer(lm, data)
        test = data.split("test")[:n_items]
        t0 = time.perf_counter()
        table = scorer.score(data.default_prompt(), test).table
        seconds = time.perf_counter() - t0
        dev = data.split("dev")[:DEV_ITEMS]
        candidates = []
        for prompt in candidate_prompts(task, data, CANDIDATES):
            candidates.append([bool(c) for c in scorer.score(prompt, dev).table["correct"]])
        out["tasks"][task] = {
            "ids": [i.id for i in test],
            "pred": [int(p) for p in table["pred"]],
            "correct": [bool(c) for c in table["correct"]],
            "tcb": [float(t) for t in table["tcb"]],
            "seconds": seconds,
            "candidates": candidates,
        }
        print(
            f"  {precision} {task}: accuracy {sum(out['tasks'][task]['correct']) / len(test):.3f} "
            f"({len(test)} items, {seconds:.1f} s); {len(candidates)} candidates on {len(dev)} dev items",
            file=sys.stderr,
        )
    out["seconds"] = time.perf_counter() - start
    del lm
    gc.collect()
    return out


def winner(candidates: list[list[bool]]) -> int:
    accs = [sum(c) / len(c) for c in candidates]
    return max(range(len(accs)), key=lambda i: (accs[i], -i))


def compare_to(base: dict, other: dict) -> dict:
    """The numbers of one quantized load against float32, per task."""
    import numpy as np

    from promptopt.metrics.stats import bootstrap_interval, mcnemar_exact, spearman, wilson_interval

    rows = {}
    for task, b in base["tasks"].items():
        o = other["tasks"][task]
        assert b["ids"] == o["ids"]
        n = len(b["ids"])
        same = int(sum(x == y for x, y in zip(b["pred"], o["pred"])))
        cb, co = np.array(b["correct"], float), np.array(o["correct"], float)
        diff = float(co.mean() - cb.mean())
        low, high = bootstrap_interval(lambda index, a=co, b=cb: float(a[index].mean() - b[index].mean()), n, seed=0)
        only_base, only_other, p = mcnemar_exact(b["correct"], o["correct"])
        tb, to = np.array(b["tcb"]), np.array(o["tcb"])
        finite = np.isfinite(tb) & np.isfinite(to) & (tb > 0)
        rel = np.abs(to[finite] - tb[finite]) / tb[finite]
        acc_b = [sum(c) / len(c) for c in b["candidates"]]
        acc_o = [sum(c) / len(c) for c in o["candidates"]]
        win_b, win_o = winner(b["candidates"]), winner(o["candidates"])
        # float32's winner, scored in this precision, against this precision's winner on the same dev items
        tie_p = 1.0 if win_b == win_o else mcnemar_exact(o["candidates"][win_o], o["candidates"][win_b])[2]
        rows[task] = {
            "n": n,
            "agreement": same / n,
            "agreement_ci95": list(wilson_interval(same, n)),
            "accuracy_float32": float(cb.mean()),
            "accuracy": float(co.mean()),
            "accuracy_diff": diff,
            "accuracy_diff_ci95": [float(low), float(high)],
            "mcnemar": {"only_float32": only_base, "only_quantized": only_other, "p": p},
            "tcb_rel_diff_median": float(np.median(rel)) if len(rel) else None,
            "tcb_rel_diff_worst": float(rel.max()) if len(rel) else None,
            "tcb_compared": int(finite.sum()),
            "winner_float32": win_b,
            "winner": win_o,
            "same_winner": win_b == win_o,
            "float32_winner_gap": acc_o[win_o] - acc_o[win_b],
            "float32_winner_gap_p": tie_p,
            "candidate_spearman": spearman(acc_b, acc_o) if len(set(acc_b)) > 1 and len(set(acc_o)) > 1 else None,
            "candidate_accuracies_float32": acc_b,
            "candidate_accuracies": acc_o,
            "seconds_float32": b["seconds"],
            "seconds": o["seconds"],
        }
    return rows


def render(results: dict) -> str:
    lines = [
        "| task | precision | agreement (95% CI) | accuracy fp32 → q | Δ accuracy (95% CI) | McNemar p | "
        "δ_TCB rel. diff median / worst | compare winner = fp32's? (its dev gap, McNemar p; Spearman) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for precision, per_task in results["against_float32"].items():
        for task, r in per_task.items():
            lo, hi = r["agreement_ci95"]
            dlo, dhi = r["accuracy_diff_ci95"]
            rho = "n/a" if r["candidate_spearman"] is None else f"{r['candidate_spearman']:.2f}"
            lines.append(
                f"| {task} ({r['n']}) | {precision} | {r['agreement']:.3f} [{lo:.3f}, {hi:.3f}] | "
                f"{r['accuracy_float32']:.3f} → {r['accuracy']:.3f} | {r['accuracy_diff']:+.3f} [{dlo:+.3f}, {dhi:+.3f}] | "
                f"{r['mcnemar']['p']:.3g} | {r['tcb_rel_diff_median']:.3f} / {r['tcb_rel_diff_worst']:.3f} | "
                + (
                    f"yes (#{r['winner']}; {rho}) |"
                    if r["same_winner"]
                    else f"no: #{r['winner']}, fp32's #{r['winner_float32']} {r['float32_winner_gap']:.2f} below "
                    f"(p {r['float32_winner_gap_p']:.2g}; {rho}) |"
                )
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every number (and the per-item predictions) as JSON")
    parser.add_argument("--table", metavar="JSON", help="print the table of an earlier --out file (no scoring)")
    args = parser.parse_args()
    if args.table:
        saved = json.load(open(args.table, encoding="utf-8"))
        base = saved["per_item"]["float32"]
        saved["against_float32"] = {p: compare_to(base, r) for p, r in saved["per_item"].items() if p != "float32"}
        print(render(saved))
        return
    quiet_libraries()
    import torch

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    per_precision = {}
    for precision in PRECISIONS:
        print(f"scoring in {precision} on {DEVICE}", file=sys.stderr)
        per_precision[precision] = score_precision(precision, TASKS)
    base = per_precision["float32"]
    results = {
        "started": started,
        "model": MODEL,
        "device": DEVICE,
        "threads": torch.get_num_threads(),
        "candidates": CANDIDATES,
        "dev_items": DEV_ITEMS,
        "loaded": {p: r["loaded"] for p, r in per_precision.items()},
        "seconds": {p: r["seconds"] for p, r in per_precision.items()},
        "against_float32": {p: compare_to(base, r) for p, r in per_precision.items() if p != "float32"},
    }
    print(f"{MODEL} on {DEVICE}, {torch.get_num_threads()} threads, started {started}")
    for precision, name in results["loaded"].items():
        print(f"  {precision}: {name}, {results['seconds'][precision]:.0f} s for everything")
    print(render(results))
    if args.out:
        from promptopt.yamlio import atomic_write_text

        results["per_item"] = per_precision
        atomic_write_text(args.out, json.dumps(results, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
