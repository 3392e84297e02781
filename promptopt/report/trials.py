"""The search section: each strategy's optimization history (optuna.visualization) and every trial's dev
accuracy against its mean δ_TCB, with each search's winner, the card export writes and the tcb rule's bound."""

from __future__ import annotations

import math

import pandas as pd

from promptopt.report import figures, scatter
from promptopt.report.numbers import finite, note

# --- the search ----------------------------------------------------------------------------------------------
_TRIAL_COLUMNS = ["strategy", "seed", "trial", "state", "accuracy", "tcb_mean", "n_dev", "template", "k"]


def _winner_trials(source) -> set[tuple[str, int, int]]:
    """(strategy, seed, trial) of each search's winner: compare's pick where there is one, else the study's best."""
    if source.candidates is not None and "trial" in source.candidates:
        chosen = source.candidates[source.candidates["winner"].astype(str).str.lower() == "true"]
        return {(str(r.strategy), int(r.seed), int(r.trial)) for r in chosen.itertuples() if finite(r.trial)}
    return {
        (s.strategy, s.seed, int(s.run.summary["best_trial"])) for s in source.studies if "best_trial" in s.run.summary
    }


def tcb_bound(trials: list, summary: dict | None = None) -> float:
    """Where the tcb strategy's tie set ends on a study's dev accuracy: the lowest dev accuracy among the trials that
    tied with the best (the selection rule's record in summary.json, metrics/stats/selection.py; its winner is the
    most stable of them). A run from before the paired rule recorded none: the lower end of the best-valued trial's
    95% Wilson interval, the bound it used then."""
    from promptopt.metrics.stats import wilson_interval

    tied = ((summary or {}).get("selection_detail") or {}).get("tie_set")
    if tied:
        return min(float(t["dev_accuracy"]) for t in tied)
    best = max(trials, key=lambda t: (t.value, -t.number))
    m = best.user_attrs.get("metrics", {})
    return wilson_interval(round(m["accuracy"] * m["n"]), m["n"])[0]


def trials_frame(source, chosen=None) -> pd.DataFrame:
    """Every finished or pruned trial: its dev numbers, whether it won its search (`winner`), whether it is the
    card export writes (`exported`), and for tcb studies the bound of the tcb rule (`rule_low`)."""
    from optuna.trial import TrialState

    winners = _winner_trials(source)
    search = (chosen.card or {}).get("search") or {} if chosen is not None else {}
    picked = None
    if chosen is not None and chosen.exported is not None:
        picked = (chosen.strategy, chosen.seed or 0, int(search.get("trial")))
        if source.kind != "compare":
            picked = (source.studies[-1].strategy, 0, picked[2])
    rows = []
    for s in source.studies:
        done = s.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        low = (
            tcb_bound(done, s.run.summary)
            if done and s.run.config.study.strategy == "tcb" and not len(s.study.directions) > 1
            else math.nan
        )
        for t in s.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            m = t.user_attrs.get("metrics", {})
            key = (s.strategy, s.seed, t.number)
            rows.append(
                {
                    "strategy": s.strategy,
                    "seed": s.seed,
                    "trial": t.number,
                    "state": t.state.name,
                    "accuracy": m.get("accuracy"),
                    "tcb_mean": m.get("tcb_mean"),
                    "n_dev": m.get("n"),
                    "template": t.params.get("template"),
                    "k": t.params.get("k"),
                    "winner": key in winners,
                    "exported": key == picked,
                    "rule_low": low,
                }
            )
    return pd.DataFrame(rows, columns=[*_TRIAL_COLUMNS, "winner", "exported", "rule_low"])


def search_section(source, chosen=None) -> str:
    if not source.studies:
        return note("No search in this directory.")
    out = [
        note("Optimization history drawn by optuna.visualization, one plot per strategy (every seed's study in it).")
    ]
    for strategy in source.strategies:
        studies = [s.study for s in source.studies if s.strategy == strategy]
        out.append(figures.embed(figures.history(studies, strategy), f"history-{strategy}", 340))
        if len(studies[0].directions) > 1:
            out.append(figures.embed(figures.pareto(studies[0]), f"pareto-{strategy}", 360))
    trials = trials_frame(source, chosen)
    pruned = int((trials["state"] == "PRUNED").sum())
    out.append('<h3 id="scatter">Accuracy vs δ_TCB</h3>')
    if trials[["accuracy", "tcb_mean"]].map(finite).all(axis=1).any():
        rows = 2 if pruned else 1
        out.append(figures.embed(scatter.trials_scatter(trials), "scatter", 200 + 260 * rows))
        out.append(
            note(
                f"{len(trials) - pruned} finished trials (all dev items) in the top row"
                + (
                    f"; {pruned} pruned trials below, their accuracy is on the dev items scored before pruning "
                    "and is not comparable."
                    if pruned
                    else "; no trial was pruned."
                )
                + " ★ each search's winner"
                + ("; the ringed ★ is the card export writes" if trials["exported"].any() else "")
                + (
                    "; dashed line (tcb): the lower end of the best-valued trial's 95% Wilson interval on dev "
                    "accuracy: tcb's winner is the most stable trial on or above it"
                    if trials["rule_low"].map(finite).any()
                    else ""
                )
                + "."
            )
        )
    else:
        out.append(note("No trial recorded accuracy and δ_TCB."))
    return "".join(out)
