"""Benchmark 3: search throughput on the embedded model with the default SST-2 space.

- trials per minute (pruning on, cold cache);
- pruning on vs off at an equal trial budget and seed: best dev objective reached, and wall time;
- the result cache: the same search replayed into a new study over a warm cache (hit rate, speed-up).
All ratios come from runs in this one process.
"""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRIALS = int(os.environ.get("BENCH_TRIALS", "16"))
DEV = int(os.environ.get("BENCH_DEV", "64"))


def main() -> None:
    import optuna
    import torch

    from promptopt.search import SearchConfig, run_search

    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        base = SearchConfig.build(task="sst2", strategy="tcb", trials=TRIALS, dev_limit=DEV, test_limit=32, device="cpu", seed=7)
        pruned = run_search(base.replace(out=f"{tmp}/pruned"), show_progress=False)
        full = run_search(base.replace(out=f"{tmp}/full", pruning=False), show_progress=False)
        replay = run_search(base.replace(out=f"{tmp}/pruned", study_name="replay"), show_progress=False)

    def best(result):  # a pruned trial's stored value is its last per-item report: compare complete ones
        return result.trials.loc[result.trials["state"] == "COMPLETE", "value_tcb"].max()

    n_pruned = int((pruned.trials["state"] == "PRUNED").sum())
    print(f"[3a] SST-2 default space, {TRIALS} trials on {DEV} dev items (embedded SmolLM2, 2 threads)")
    print(f"     pruning on : {TRIALS / pruned.wall_seconds * 60:.1f} trials/min, wall {pruned.wall_seconds:.1f}s, "
          f"{n_pruned} pruned, best dev objective {best(pruned):.4f}")
    print(f"     pruning off: {TRIALS / full.wall_seconds * 60:.1f} trials/min, wall {full.wall_seconds:.1f}s, "
          f"best dev objective {best(full):.4f}")
    print(f"     pruning wall-time ratio off/on {full.wall_seconds / pruned.wall_seconds:.2f}x; "
          f"best objective on − off {best(pruned) - best(full):+.4f}")
    print(f"[3b] result cache: cold run hit rate {pruned.cache_hit_rate:.2f}; replay of the same seed into a new study "
          f"hit rate {replay.cache_hit_rate:.2f}, {pruned.wall_seconds / replay.wall_seconds:.1f}x faster than cold")


if __name__ == "__main__":
    main()
