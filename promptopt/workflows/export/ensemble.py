"""`export --ensemble K`: a K-member card from a finished search or compare, its members chosen by greedy forward
selection on the dev items (workflows/ensemble.py) among every distinct finished trial of its searches (or of
`--strategy S`'s). Dev items only: test numbers are never read to choose."""

from __future__ import annotations

import json
from pathlib import Path

from promptopt.errors import UserError
from promptopt.study.tableset import check_table_set
from promptopt.workflows.ensemble import Member, greedy_select
from promptopt.workflows.ensemble import ensemble_candidates as build_candidates
from promptopt.workflows.export.runs import Run, decode_trial, load_study, open_run, read_json
from promptopt.workflows.export.select import is_compare_dir

MAX_CANDIDATES = 32  # the best distinct trials by dev accuracy that may become members


def search_runs(root: Path, strategy: str | None) -> list[Run]:
    """The searches of a compare directory (every strategy and seed, or `strategy`'s), or the search run itself."""
    if not is_compare_dir(root):
        return [open_run(root, strategy=strategy)]
    check_table_set(root, "compare")
    summary = read_json(root / "summary.json", missing={})
    names = [s for s in summary.get("strategies", []) if strategy is None or s == strategy]
    if strategy is not None and not names:
        raise UserError(f"--strategy {strategy}: {root} compares {', '.join(summary.get('strategies', []))}")
    runs = []
    for name in names:
        seeds = sorted((root / name).glob("seed*/config.json")) or [root / name / "config.json"]
        for config in seeds:
            pick = {
                "strategy": name,
                "seed": int(config.parent.name[4:]) if config.parent.name.startswith("seed") else 0,
            }
            runs.append(open_run(root, pick={**pick, "trial": None, "selection": ""}))
    return runs


def ensemble_candidates(runs: list[Run], session, dev_items: list) -> list[Member]:
    """Every distinct finished (COMPLETE) trial of the runs, its rule fit on dev and its dev answers decided,
    ordered by dev accuracy (ties: the run's order, then the trial number); at most MAX_CANDIDATES."""
    from optuna.trial import TrialState

    seen, members = set(), []
    for order, run in enumerate(runs):
        study = load_study(run, session.data)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            prompt = decode_trial(run, session.data, trial.params)
            key = json.dumps(prompt.to_card(), sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            accuracy = trial.user_attrs.get("metrics", {}).get("accuracy", float("nan"))
            source = {
                "strategy": run.config.study.strategy,
                "study": run.config.name,
                "seed": run.config.study.seed,
                "trial": trial.number,
                "dev_accuracy": accuracy,
            }
            members.append((-(accuracy if accuracy == accuracy else -1.0), order, trial.number, prompt, source))
    members.sort(key=lambda m: m[:3])
    return build_candidates([m[3:] for m in members], session.scorer, dev_items, limit=MAX_CANDIDATES)


def choose_ensemble(runs: list[Run], session, dev_items: list, k: int, objective: str) -> dict:
    """The `ensemble` argument of build_card: K members and how they were chosen."""
    if session.data.spec.answer.generative:
        raise UserError("--ensemble: an ensemble combines label log-probabilities; this task is generative")
    if objective != "accuracy":
        raise UserError(
            "--ensemble-objective robust is measured by `promptopt compare --ensembles`; export chooses on dev accuracy"
        )
    candidates = ensemble_candidates(runs, session, dev_items)
    chosen, trace = greedy_select(candidates, k, objective)
    trials = ", ".join(f"{m.source['study']}#{m.source['trial']}" for m in chosen)
    selection = (
        f"greedy forward selection of {k} members on {len(dev_items)} dev items (dev {objective} after each step: "
        f"{', '.join(f'{v:.3f}' for v in trace)}) among the {len(candidates)} best distinct finished trials: {trials}; "
        "no test number was read"
    )
    return {
        "members": [(m.prompt, {**m.source, "dev_accuracy_decided": float(m.dev["correct"].mean())}) for m in chosen],
        "selection": selection,
        "objective": objective,
    }


__all__ = ["MAX_CANDIDATES", "choose_ensemble", "ensemble_candidates", "search_runs"]
