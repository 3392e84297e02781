"""Benchmark 3: search throughput on the embedded model with the default SST-2 space.

- trials per minute (pruning on, cold cache);
- pruning on vs off at an equal trial budget and seed: best dev objective reached, and wall time;
- the result cache: the same search replayed into a new study over a warm cache (hit rate, speed-up);
- `robust` (multi-fidelity: variants only for trials alive under the accuracy pruner that can still win)
  next to `accuracy` at the same budget (trials, dev items, seed): distinct (prompt, item) pairs scored
  (result-cache misses, cold cache), wall time and the trials' own time; the target is robust ≤ 2× accuracy.
All ratios come from runs in this one process. BENCH_TRIALS, BENCH_DEV size it; BENCH_ONLY=3c runs only
the robust-vs-accuracy part (3ab only the others).
"""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRIALS = int(os.environ.get("BENCH_TRIALS", "16"))
DEV = int(os.environ.get("BENCH_DEV", "64"))
ONLY = os.environ.get("BENCH_ONLY", "")  # "3c": only robust vs accuracy; "3ab": only pruning and the cache


def main() -> None:
    import optuna
    import torch

    from promptopt.robustness import VariantExpander
    from promptopt.study import SearchConfig, run_search

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        base = SearchConfig.build(
            task="sst2", strategy="tcb", trials=TRIALS, dev_limit=DEV, test_limit=32, device="cpu", seed=7
        )
        if ONLY != "3c":
            pruning_and_cache(base, tmp, run_search)
        if ONLY != "3ab":
            accuracy = run_search(base.replace(out=f"{tmp}/accuracy", strategy="accuracy"), show_progress=False)
            robust = run_search(
                base.replace(out=f"{tmp}/robust", strategy="robust"),
                expand=VariantExpander("cheap"),
                show_progress=False,
            )
            robust_vs_accuracy(accuracy, robust)


def pruning_and_cache(base, tmp, run_search) -> None:
    pruned = run_search(base.replace(out=f"{tmp}/pruned"), show_progress=False)
    full = run_search(base.replace(out=f"{tmp}/full", pruning=False), show_progress=False)
    replay = run_search(base.replace(out=f"{tmp}/pruned", study_name="replay"), show_progress=False)

    def best(result):  # a pruned trial's stored value is its last per-item report: compare complete ones
        return result.trials.loc[result.trials["state"] == "COMPLETE", "value_tcb"].max()

    n_pruned = int((pruned.trials["state"] == "PRUNED").sum())
    print(f"[3a] SST-2 default space, {TRIALS} trials on {DEV} dev items (embedded SmolLM2, 2 threads)")
    print(
        f"     pruning on : {TRIALS / pruned.wall_seconds * 60:.1f} trials/min, wall {pruned.wall_seconds:.1f}s, "
        f"{n_pruned} pruned, best dev objective {best(pruned):.4f}"
    )
    print(
        f"     pruning off: {TRIALS / full.wall_seconds * 60:.1f} trials/min, wall {full.wall_seconds:.1f}s, "
        f"best dev objective {best(full):.4f}"
    )
    print(
        f"     pruning wall-time ratio off/on {full.wall_seconds / pruned.wall_seconds:.2f}x; "
        f"best objective on − off {best(pruned) - best(full):+.4f}"
    )
    print(
        f"[3b] result cache: cold run hit rate {pruned.cache_hit_rate:.2f}; replay of the same seed into a new study "
        f"hit rate {replay.cache_hit_rate:.2f}, {pruned.wall_seconds / replay.wall_seconds:.1f}x faster than cold"
    )


def robust_vs_accuracy(accuracy, robust) -> None:
    def trial_seconds(result):  # the trials' own time: without model loading and the winner's test scoring
        return result.trials["duration"].dt.total_seconds().sum()

    def states(result):
        finished = result.trials[result.trials["state"].isin(["COMPLETE", "PRUNED"])]
        out = f"{(finished['state'] == 'COMPLETE').sum()} complete"
        if "user_attrs_rung" in finished:
            pruned = finished[finished["state"] == "PRUNED"]["user_attrs_rung"].value_counts()
            out += "".join(f", {n} pruned at {rung}" for rung, n in pruned.items())
        else:
            out += f", {(finished['state'] == 'PRUNED').sum()} pruned"
        return out

    print(
        f"[3c] robust (multi-fidelity, suite cheap) vs accuracy: {TRIALS} trials, {DEV} dev items, seed 7, cold caches"
    )
    for name, result in (("accuracy", accuracy), ("robust", robust)):
        value = result.trials.loc[result.trials["state"] == "COMPLETE", f"value_{name}"].max()
        print(
            f"     {name:<9}: {result.pairs_scored} distinct (prompt, item) pairs scored, wall {result.wall_seconds:.1f}s "
            f"(trials {trial_seconds(result):.1f}s), {states(result)}, best dev {name} {value:.4f}"
        )
    print(
        f"     robust/accuracy: pairs {robust.pairs_scored / accuracy.pairs_scored:.2f}x, wall "
        f"{robust.wall_seconds / accuracy.wall_seconds:.2f}x, trials' time {trial_seconds(robust) / trial_seconds(accuracy):.2f}x "
        "(target <= 2x)"
    )


if __name__ == "__main__":
    main()
