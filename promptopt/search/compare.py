"""`promptopt compare`: the δ_TCB paper's Table 4 — strategies with the same budget, seed and items,
their winners (and the task's default prompt as the baseline) evaluated on the same held-out test items."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from promptopt.search.objectives import get_strategy
from promptopt.search.study import SearchConfig, run_search
from promptopt.yamlio import atomic_write_bytes_via


def _row(name: str, summary: dict, wall: float | None, extra: dict | None = None) -> dict:
    row = {
        "strategy": name,
        "n_test": summary["n"],
        "avg_acc": summary["accuracy"],
        "avg_tcb": summary.get("tcb_mean"),
        "tcb_geomean": summary.get("tcb_geomean"),
        "avg_ppl": summary["ppl_mean"],
        "wall_seconds": wall,
    }
    row.update(extra or {})
    return row


def run_compare(base: SearchConfig, strategies: list[str], *, show_progress: bool = True) -> pd.DataFrame:
    """One study per strategy (shared storage, same seed, dev and test items), then one comparison table."""
    for name in strategies:
        get_strategy(name)  # fail on a typo before anything runs
    out = Path(base.out)
    storage = base.storage or f"sqlite:///{out.resolve() / 'studies.db'}"
    rows = []
    for name in strategies:
        config = replace(base, strategy=name, out=str(out / name), storage=storage, study_name=None)
        result = run_search(config, show_progress=show_progress)
        rows.append(_row(name, result.test, result.wall_seconds, {"best_trial": result.best_number, "card": str(result.card_path)}))
    rows.insert(0, _baseline_row(base))
    table = pd.DataFrame(rows)
    atomic_write_bytes_via(out / "compare.csv", lambda p: table.to_csv(p, index=False))
    atomic_write_bytes_via(out / "compare.parquet", lambda p: table.to_parquet(p, index=False))
    return table


def _baseline_row(base: SearchConfig) -> dict:
    """The task's own default prompt on the same test items (the 'Baseline Prompt' row)."""
    from promptopt.models import load_model
    from promptopt.scoring import Scorer
    from promptopt.tasks import load_task

    data = load_task(base.task, subsets=base.subsets)
    lm = load_model(base.model, device=base.device, dtype=base.dtype, quantize=base.quantize)
    start = time.perf_counter()
    result = Scorer(lm, data, batch_size=base.batch_size).score(data.default_prompt(), data.test[: base.test_limit])
    return _row("baseline", result.summary, time.perf_counter() - start, {"card": "task default prompt"})
