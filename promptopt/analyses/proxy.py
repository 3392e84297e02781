"""`promptopt diagnose proxy RUN_DIR`: is δ_TCB a good proxy for robustness on *this* task and model?

Over M trials of a finished study, spread over its range of trial values, each prompt is stressed with a
perturbation suite on dev items (measured robustness: per-item Acc_worst, PDR) and the cheap signals that
need no perturbation are read from the same clean run (mean log10 δ_TCB, mean signed stability, PPL,
margin, V_eff, accuracy). The answer is the Spearman correlation of each signal with each measured
robustness number across the M prompts, with a seeded 95% bootstrap interval over prompts. A signal
whose interval excludes 0 predicts robustness here; one that straddles 0 does not, at this M.

The item-level question comes beside it: over every answer (M prompts × dev items), the AUROC of each clean
signal for "this answer changes under some unseen perturbation" (`promptopt.analyses.item_auroc`; a family
is unseen when `search_suite` has no family of its name or operator). The suite defaults to `unseen`, the
families no search looks at. Given directories (or files) that hold a robustness items table instead of a
search (a `compare` or `evaluate --out` folder), only the AUROC table is computed, from the answers kept
there: no model is loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt import progress as steps
from promptopt.analyses.item_auroc import item_auroc
from promptopt.errors import UserError
from promptopt.metrics.stats import spearman, spearman_interval
from promptopt.yamlio import atomic_write_bytes_via, write_table

SIGNALS = ("log10_tcb", "signed_stability", "ppl", "margin", "v_eff", "accuracy")
TARGETS = ("acc_worst", "pdr")


AUROC_FILE = "proxy_item_auroc.csv"
ITEMS_FILE = "proxy_items.parquet"


@dataclass
class ProxyResult:
    prompts: pd.DataFrame | None  # one row per prompt: signals and measured robustness (None: from items tables)
    correlations: pd.DataFrame | None  # one row per (signal, target)
    folder: Path | None = None  # where the tables were written
    auroc: pd.DataFrame | None = None  # one row per signal: item-level AUROC for "changes under an unseen perturbation"
    written: list = field(default_factory=list)  # the files written


def _items_files(path: Path) -> list[Path]:
    """A robustness items table given directly, or those a compare / evaluate folder holds (no search in it)."""
    if path.is_file() and path.suffix == ".parquet":
        return [path]
    if path.is_dir() and not (path / "config.json").is_file():
        return sorted(path.glob("*_items.parquet"))
    return []


def diagnose_proxy(run_dirs, **options) -> ProxyResult:
    """`promptopt diagnose proxy`: search run directories -> `proxy_correlations`; folders (or files) holding a
    robustness items table and no search -> `proxy_from_items` (the item-level AUROC alone)."""
    paths = [Path(r) for r in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs)]
    found = [_items_files(p) for p in paths]
    if paths and all(found):
        return proxy_from_items(
            [f for files in found for f in files], seed=options.get("seed", 0), out=options.get("out")
        )
    return proxy_correlations(paths, **options)


def proxy_from_items(files: list[Path], *, seed: int = 0, out: str | Path | None = None) -> ProxyResult:
    """The item-level AUROC table from answers already kept (robustness_items.parquet of a compare or an evaluate),
    written as proxy_item_auroc.csv beside the first table (or in `out`)."""
    from promptopt.yamlio import check_output

    if out is not None:
        check_output(out, folder=True, what="--out")
    tables = []
    for path in files:
        try:
            table = pd.read_parquet(path)
        except (OSError, ValueError) as exc:  # not a Parquet file, or a damaged one: the user's input
            raise UserError(
                f"{path}: cannot read the robustness items table ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
            ) from None
        tables.append(table.assign(source=str(path)) if len(files) > 1 else table)
    auroc = item_auroc(pd.concat(tables, ignore_index=True), seed=seed)
    target = Path(out) if out is not None else files[0].parent
    atomic_write_bytes_via(target / AUROC_FILE, lambda p: auroc.to_csv(p, index=False))
    return ProxyResult(None, None, target, auroc, [target / AUROC_FILE])


def proxy_correlations(
    run_dirs,
    *,
    n_trials: int = 8,
    limit: int | None = 40,
    suite: str = "unseen",
    search_suite: str | None = "cheap",
    seed: int = 0,
    out: str | Path | None = None,
    show_progress: bool = True,
) -> ProxyResult:
    """`run_dirs`: one search run directory or several of one task and model (e.g. every strategy and seed of a
    `compare`), whose complete trials are pooled: more distinct prompts, tighter intervals. The M prompts are
    taken evenly over each study's ranking of its values, round-robin across studies, identical prompts once.
    Tables go to `out` (default: the run directory, or the runs' common parent)."""
    import os

    from optuna.trial import TrialState

    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite, seen_families
    from promptopt.study import SearchConfig, decode_params
    from promptopt.study.storage import read_study
    from promptopt.study.strategies import signed_stability
    from promptopt.workflows.session import Session
    from promptopt.yamlio import check_output

    if out is not None:
        check_output(out, folder=True, what="--out")
    runs = [Path(r) for r in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs)]
    if not runs:
        raise UserError("diagnose proxy: give at least one run directory")
    the_suite = load_suite(suite)
    seen = seen_families(the_suite, load_suite(search_suite) if search_suite else None)
    studies = []
    for run in runs:
        if not (run / "config.json").is_file():
            raise UserError(f"{run}: not a search run directory (no config.json)")
        config = SearchConfig.from_dict(json.loads((run / "config.json").read_text()))
        if studies and (config.model.spec, config.data.task) != (studies[0][0].model.spec, studies[0][0].data.task):
            raise UserError(
                f"{run}: model {config.model.spec} / task {config.data.task} differ from {runs[0]}'s; "
                "pool runs of one model and task"
            )
        config = config.moved_to(run, run)
        study = read_study(config, where=str(run))
        finished = sorted(
            study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: (t.values[0], t.number)
        )
        studies.append((config, run, finished))
    total = sum(len(f) for _, _, f in studies)
    if total < 3:
        raise UserError(f"{', '.join(map(str, runs))}: {total} complete trials; a correlation needs at least 3")
    config0 = studies[0][0]
    session = Session(model=config0.model, data=config0.data, out=runs[0], batch_size=config0.batch_size)
    per_study = -(-n_trials // len(studies))  # ceil
    queues = []
    for config, run, finished in studies:
        spread = (
            sorted(set(np.linspace(0, len(finished) - 1, min(per_study, len(finished))).round().astype(int)))
            if finished
            else []
        )
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
        raise UserError(
            f"{', '.join(map(str, runs))}: {len(picks)} distinct prompts among the complete trials; a correlation needs at least 3"
        )
    items = session.items("dev", limit)
    similarity = Similarity()
    rows, answers = [], []
    for run, trial, prompt in steps.iterate(
        picks, f"stressing prompts on {len(items)} dev items", label=lambda p: f"{p[0]}#{p[1].number}"
    ):
        clean = session.scorer.score(prompt, items).table
        rob = evaluate_robustness(
            session.scorer,
            prompt,
            items,
            the_suite,
            pool=session.data.pool,
            similarity=similarity,
            paraphrases=session.paraphrases,
            seen=seen,
            progress=show_progress,
            desc=f"proxy trial {trial.number}",
        )
        answers.append(rob.items.assign(prompt=f"{run}#{trial.number}"))
        tcb = clean["tcb"].replace([np.inf], np.nan).dropna()
        rows.append(
            {
                "run": str(run),
                "trial": trial.number,
                "log10_tcb": float(np.log10(tcb).mean()) if len(tcb) else math.nan,
                "signed_stability": float(signed_stability(clean).mean()),
                "ppl": float(clean["ppl"].mean()),
                "margin": float(clean["margin"].mean()),
                "v_eff": float(clean["v_eff"].mean()),
                "accuracy": float(clean["correct"].mean()),
                "acc_worst": rob.summary["acc_worst"],
                "pdr": rob.summary["pdr"],
                "acc_worst_unseen": rob.summary["acc_worst_unseen"],
                "pdr_unseen": rob.summary["pdr_unseen"],
            }
        )
    prompts = pd.DataFrame(rows)
    correlations = correlation_table(prompts, seed=seed)
    kept = pd.concat(answers, ignore_index=True)
    auroc = item_auroc(kept, seed=seed)
    target = (
        Path(out)
        if out is not None
        else runs[0]
        if len(runs) == 1
        else Path(os.path.commonpath([r.resolve() for r in runs]))
    )
    atomic_write_bytes_via(target / "proxy_prompts.csv", lambda p: prompts.to_csv(p, index=False))
    atomic_write_bytes_via(target / "proxy_correlations.csv", lambda p: correlations.to_csv(p, index=False))
    write_table(kept[["prompt", *(c for c in kept.columns if c != "prompt")]], target / ITEMS_FILE)
    atomic_write_bytes_via(target / AUROC_FILE, lambda p: auroc.to_csv(p, index=False))
    written = [target / name for name in ("proxy_prompts.csv", "proxy_correlations.csv", ITEMS_FILE, AUROC_FILE)]
    return ProxyResult(prompts, correlations, target, auroc, written)


def correlation_table(prompts: pd.DataFrame, *, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """Spearman ρ of every cheap signal with every robustness target, with bootstrap intervals over prompts."""
    rows = []
    for target in TARGETS:
        for signal in SIGNALS:
            pair = prompts[[signal, target]].dropna()
            x, y = pair[signal].to_numpy(), pair[target].to_numpy()
            rho = spearman(x, y)
            low, high = spearman_interval(x, y, n_boot=n_boot, seed=seed)
            rows.append(
                {
                    "signal": signal,
                    "target": target,
                    "n_prompts": len(x),
                    "spearman": rho,
                    "ci_low": low,
                    "ci_high": high,
                    "interval_excludes_0": bool(low > 0 or high < 0),
                }
            )
    return pd.DataFrame(rows)
