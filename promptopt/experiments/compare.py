"""`promptopt compare`: the δ_TCB paper's Table 4 — strategies with the same budget, seed and items,
their winners (and the task's default prompt as the baseline) evaluated on the same held-out test items:
Avg Acc, Avg δ_TCB, Avg PPL, and under perturbation AccVar_pert, PDR, Acc_worst, plus taboo retention at
i = 1 for generative tasks.

One session: the model is loaded once and one result cache serves every study (a prompt two strategies
both try is scored once); all studies live in one storage (`study.db` in the run directory by default).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from promptopt.experiments.session import Session
from promptopt.search import SearchConfig, get_strategy, run_search
from promptopt.search.study import check_search
from promptopt.yamlio import atomic_write_bytes_via, check_output


def run_compare(
    base: SearchConfig,
    strategies: list[str],
    *,
    suite: str | None = "default",
    robust_limit: int | None = None,
    show_progress: bool = True,
) -> pd.DataFrame:
    """One study per strategy (shared storage, same seed, dev and test items), then one comparison table.
    `suite=None` skips the robustness columns; `robust_limit` caps the test items they use."""
    from promptopt.robustness.suite import Similarity, load_suite

    for name in strategies:
        get_strategy(name)  # fail on a typo before anything runs
    the_suite = load_suite(suite) if suite else None
    out = Path(base.out)
    check_output(out, folder=True, what="--out")
    storage = base.study.storage or f"sqlite:///{out.resolve() / 'study.db'}"
    session = Session(model=base.model, data=base.data, out=out, batch_size=base.batch_size)
    for name in strategies:  # every study's space checked before the first one runs
        check_search(base.replace(strategy=name), session.data)
    test = session.items("test")
    rows, prompts = [], {}
    for name in strategies:
        config = base.replace(strategy=name, out=str(out / name), storage=storage, study_name=None)
        result = run_search(config, scorer=session.scorer, show_progress=show_progress)
        rows.append(_row(name, result.test, result.wall_seconds, {"best_trial": result.best_number, "card": str(result.card_path)}))
        prompts[name] = result.prompt

    start = time.perf_counter()
    baseline_prompt = session.data.default_prompt()
    baseline = session.scorer.score(baseline_prompt, test)
    rows.insert(0, _row("baseline", baseline.summary, time.perf_counter() - start, {"card": "task default prompt"}))
    prompts["baseline"] = baseline_prompt
    if the_suite is not None:
        similarity = Similarity()  # one embedding model for every prompt
        for row in rows:
            row.update(_robustness(session, prompts[row["strategy"]], test[:robust_limit], the_suite, similarity, show_progress))
    table = pd.DataFrame(rows)
    atomic_write_bytes_via(out / "compare.csv", lambda p: table.to_csv(p, index=False))
    atomic_write_bytes_via(out / "compare.parquet", lambda p: table.to_parquet(p, index=False))
    return table


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


def _robustness(session: Session, prompt, items, suite, similarity, progress) -> dict:
    from promptopt.robustness import taboo_stress
    from promptopt.robustness.suite import evaluate_robustness

    scorer = session.scorer
    rob = evaluate_robustness(scorer, prompt, items, suite, pool=session.data.pool, similarity=similarity,
                              progress=progress, desc=f"robustness {prompt.task}")
    out = {
        "acc_var_pert": rob.summary["acc_var_pert"],
        "pdr": rob.summary["pdr"],
        "acc_worst": rob.summary["acc_worst"],
        "acc_worst_family": rob.summary["acc_worst_family"],
        "tcb_perturbed": rob.summary["tcb_perturbed_mean"],
        "taboo_retention_i1": math.nan,  # log-likelihood tasks generate nothing to stress
    }
    if session.data.spec.generative:
        stress = taboo_stress(scorer, prompt, items, ranks=(1,)).summary.set_index("rank")
        out["taboo_retention_i1"] = stress.loc[1, "retention"]
    return out
