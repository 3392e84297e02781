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
    folder: Path | None = None  # where the two tables were written


def proxy_correlations(run_dirs, *, n_trials: int = 8, limit: int | None = 40, suite: str = "quick",
                       seed: int = 0, out: str | Path | None = None, show_progress: bool = True) -> ProxyResult:
    """`run_dirs`: one search run directory or several of one task and model (e.g. every strategy and seed of a
    `compare`), whose complete trials are pooled: more distinct prompts, tighter intervals. The M prompts are
    taken evenly over each study's ranking of its values, round-robin across studies, identical prompts once.
    Tables go to `out` (default: the run directory, or the runs' common parent)."""
    import os

    import optuna
    from optuna.trial import TrialState

    from promptopt.experiments.session import Session
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.search import SearchConfig
    from promptopt.search.strategies import signed_stability
    from promptopt.search import decode_params

    from promptopt.yamlio import check_output

    if out is not None:
        check_output(out, folder=True, what="--out")
    runs = [Path(r) for r in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs)]
    if not runs:
        raise UserError("diagnose proxy: give at least one run directory")
    the_suite = load_suite(suite)
    studies = []
    for run in runs:
        if not (run / "config.json").is_file():
            raise UserError(f"{run}: not a search run directory (no config.json)")
        config = SearchConfig.from_dict(json.loads((run / "config.json").read_text()))
        if studies and (config.model.spec, config.data.task) != (studies[0][0].model.spec, studies[0][0].data.task):
            raise UserError(f"{run}: model {config.model.spec} / task {config.data.task} differ from {runs[0]}'s; "
                            "pool runs of one model and task")
        try:
            study = optuna.load_study(study_name=config.name, storage=config.storage_url)
        except Exception as exc:  # a missing study or storage is the user's to fix
            raise UserError(f"{run}: cannot open study '{config.name}': {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        finished = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: (t.values[0], t.number))
        studies.append((config, run, finished))
    total = sum(len(f) for _, _, f in studies)
    if total < 3:
        raise UserError(f"{', '.join(map(str, runs))}: {total} complete trials; a correlation needs at least 3")
    config0 = studies[0][0]
    session = Session(model=config0.model, data=config0.data, out=runs[0], batch_size=config0.batch_size)
    per_study = -(-n_trials // len(studies))  # ceil
    queues = []
    for config, run, finished in studies:
        spread = sorted(set(np.linspace(0, len(finished) - 1, min(per_study, len(finished))).round().astype(int))) if finished else []
        queues.append([(config, run, finished[i]) for i in spread])
    picks, seen = [], set()
    while len(picks) < n_trials and any(queues):
        for queue in queues:
            if queue and len(picks) < n_trials:
                config, run, trial = queue.pop(0)
                prompt = decode_params(config, session.data, trial.params)
                key = json.dumps(prompt.to_card(), sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    picks.append((run, trial, prompt))
    if len(picks) < 3:
        raise UserError(f"{', '.join(map(str, runs))}: {len(picks)} distinct prompts among the complete trials; a correlation needs at least 3")
    items = session.items("dev", limit)
    similarity = Similarity()
    rows = []
    for run, trial, prompt in picks:
        clean = session.scorer.score(prompt, items).table
        rob = evaluate_robustness(session.scorer, prompt, items, the_suite, pool=session.data.pool, similarity=similarity,
                                  paraphrases=session.paraphrases,
                                  progress=show_progress, desc=f"proxy trial {trial.number}")
        tcb = clean["tcb"].replace([np.inf], np.nan).dropna()
        rows.append({"run": str(run), "trial": trial.number, "log10_tcb": float(np.log10(tcb).mean()) if len(tcb) else math.nan,
                     "signed_stability": float(signed_stability(clean).mean()), "ppl": float(clean["ppl"].mean()),
                     "margin": float(clean["margin"].mean()), "v_eff": float(clean["v_eff"].mean()),
                     "accuracy": float(clean["correct"].mean()), "acc_worst": rob.summary["acc_worst"], "pdr": rob.summary["pdr"]})
    prompts = pd.DataFrame(rows)
    correlations = correlation_table(prompts, seed=seed)
    target = Path(out) if out is not None else runs[0] if len(runs) == 1 else Path(os.path.commonpath([r.resolve() for r in runs]))
    atomic_write_bytes_via(target / "proxy_prompts.csv", lambda p: prompts.to_csv(p, index=False))
    atomic_write_bytes_via(target / "proxy_correlations.csv", lambda p: correlations.to_csv(p, index=False))
    return ProxyResult(prompts, correlations, target)


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
