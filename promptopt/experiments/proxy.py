"""`promptopt diagnose proxy RUN_DIR`: is δ_TCB a good proxy for robustness on *this* task and model?

Over M trials of a finished study, spread over its range of trial values, each prompt is stressed with a
perturbation suite on dev items (measured robustness: per-item Acc_worst, PDR) and the cheap signals that
need no perturbation are read from the same clean run (mean log10 δ_TCB, mean signed stability, PPL,
margin, V_eff, accuracy). The answer is the Spearman correlation of each signal with each measured
robustness number across the M prompts, with a seeded 95% bootstrap interval over prompts. A signal
whose interval excludes 0 predicts robustness here; one that straddles 0 does not, at this M.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.errors import UserError
from promptopt.metrics.stats import bootstrap_interval, spearman
from promptopt.yamlio import atomic_write_bytes_via

SIGNALS = ("log10_tcb", "signed_stability", "ppl", "margin", "v_eff", "accuracy")
TARGETS = ("acc_worst", "pdr")


@dataclass
class ProxyResult:
    prompts: pd.DataFrame  # one row per prompt: signals and measured robustness
    correlations: pd.DataFrame  # one row per (signal, target)


def proxy_correlations(run_dir: str | Path, *, n_trials: int = 8, limit: int | None = 40, suite: str = "quick",
                       seed: int = 0, show_progress: bool = True) -> ProxyResult:
    import optuna
    from optuna.trial import TrialState

    from promptopt.experiments.session import Session
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.search import SearchConfig
    from promptopt.search.objectives import signed_stability
    from promptopt.search.study import decode_params

    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise UserError(f"{run}: not a search run directory (no config.json)")
    config = SearchConfig.from_dict(json.loads((run / "config.json").read_text()))
    the_suite = load_suite(suite)
    try:
        study = optuna.load_study(study_name=config.name, storage=config.storage_url)
    except Exception as exc:  # a missing study or storage is the user's to fix
        raise UserError(f"{run}: cannot open study '{config.name}': {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    finished = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: (t.values[0], t.number))
    if len(finished) < 3:
        raise UserError(f"{run}: study '{config.name}' has {len(finished)} complete trials; a correlation needs at least 3")
    picks = [finished[i] for i in sorted(set(np.linspace(0, len(finished) - 1, min(n_trials, len(finished))).round().astype(int)))]
    session = Session(model=config.model, data=config.data, out=run, batch_size=config.batch_size)
    items = session.items("dev", limit)
    similarity = Similarity()
    rows = []
    for trial in picks:
        prompt = decode_params(config, session.data, trial.params)
        clean = session.scorer.score(prompt, items).table
        rob = evaluate_robustness(session.scorer, prompt, items, the_suite, pool=session.data.pool, similarity=similarity,
                                  progress=show_progress, desc=f"proxy trial {trial.number}")
        tcb = clean["tcb"].replace([np.inf], np.nan).dropna()
        rows.append({"trial": trial.number, "log10_tcb": float(np.log10(tcb).mean()) if len(tcb) else math.nan,
                     "signed_stability": float(signed_stability(clean).mean()), "ppl": float(clean["ppl"].mean()),
                     "margin": float(clean["margin"].mean()), "v_eff": float(clean["v_eff"].mean()),
                     "accuracy": float(clean["correct"].mean()), "acc_worst": rob.summary["acc_worst"], "pdr": rob.summary["pdr"]})
    prompts = pd.DataFrame(rows)
    correlations = correlation_table(prompts, seed=seed)
    atomic_write_bytes_via(run / "proxy_prompts.csv", lambda p: prompts.to_csv(p, index=False))
    atomic_write_bytes_via(run / "proxy_correlations.csv", lambda p: correlations.to_csv(p, index=False))
    return ProxyResult(prompts, correlations)


def correlation_table(prompts: pd.DataFrame, *, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """Spearman ρ of every cheap signal with every robustness target, with bootstrap intervals over prompts."""
    rows = []
    for target in TARGETS:
        for signal in SIGNALS:
            pair = prompts[[signal, target]].dropna()
            x, y = pair[signal].to_numpy(), pair[target].to_numpy()
            rho = spearman(x, y)
            low, high = bootstrap_interval(lambda idx: spearman(x[idx], y[idx]), len(x), n_boot=n_boot, seed=seed)
            rows.append({"signal": signal, "target": target, "n_prompts": len(x), "spearman": rho, "ci_low": low, "ci_high": high,
                         "interval_excludes_0": bool(low > 0 or high < 0)})
    return pd.DataFrame(rows)
