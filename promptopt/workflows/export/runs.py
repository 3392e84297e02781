"""A finished run directory (a search run, or one search of a compare directory) and the trial to export from it:
its settings, summary and study, the winner (or a named trial), and the prompt the trial's parameters decode to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from promptopt.errors import UserError
from promptopt.prompts import Prompt
from promptopt.study.tableset import check_table_set
from promptopt.workflows.export.measure import clean
from promptopt.workflows.export.select import (
    compare_candidates,
    is_compare_dir,
    plain_row,
    select_by_dev,
    strategy_rows,
)


@dataclass(frozen=True, kw_only=True)
class Run:
    """A finished search run directory (standalone, or one strategy of a compare directory)."""

    path: Path
    config: object  # SearchConfig
    summary: dict
    cache_dir: Path  # where its result cache (cache.sqlite) lives: the run, or the compare directory
    compare_row: dict | None = None  # its row of compare_runs.csv: the numbers compare measured for it
    winner_trial: int | None = None  # the trial compare chose, when it is not simply the study's best
    selection: str = ""  # how it was chosen, in words (recorded in the card)
    selection_detail: dict | None = None  # the selection rule's record: tie set, tie-break, detectable difference


def open_run(
    run_dir: str | Path, *, strategy: str | None = None, pick: dict | None = None, tie_break: str | None = None
) -> Run:
    """A search run directory, or one search of a compare directory: `pick` (a compare_runs.csv row chosen by
    `select_robust`), else the selection rule's choice (`select_by_dev`, `tie_break`) among the winners of
    `strategy` or of every strategy. Errors name the directory and what is missing."""
    from promptopt.study import SearchConfig

    root = Path(run_dir)
    winner_trial, selection, detail = None, "", None
    if not root.is_dir():
        raise UserError(f"{root}: no such run directory")
    compare_row = None
    if is_compare_dir(root):
        candidates = strategy_rows(compare_candidates(root), strategy, root)
        if pick is None:
            pick, selection, detail = select_by_dev(candidates, tie_break=tie_break)
            pick = plain_row(pick)
        else:
            selection, detail = pick.pop("selection", ""), pick.pop("selection_detail", None)
        strategy = str(pick["strategy"])
        compare_row = pick
        seed_dir = root / strategy / f"seed{int(pick['seed'])}"
        path, cache_dir = (seed_dir if seed_dir.is_dir() else root / strategy), root
        winner_trial = int(pick["trial"]) if pick.get("trial") is not None else None
    elif (root / "config.json").is_file():
        path, cache_dir = root, root
    else:
        raise UserError(f"{root}: not a run directory (no config.json) nor a compare directory (no compare.csv)")
    if not (path / "config.json").is_file():
        raise UserError(f"{path}: config.json missing: the run never started")
    try:
        config = SearchConfig.from_dict(read_json(path / "config.json"))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UserError(f"{path / 'config.json'}: unreadable run settings ({str(exc)[:200]})") from None
    config = config.moved_to(path, root)
    if strategy is not None and compare_row is None and config.study.strategy != strategy:
        raise UserError(f"--strategy {strategy}: {path} is a {config.study.strategy} run")
    if not (path / "summary.json").is_file():
        raise UserError(
            f"{path}: no finished study (summary.json missing): finish it with `promptopt search ... --resume`"
        )
    check_table_set(path, "search", resume_with="compare" if cache_dir != path else "search")
    summary = read_json(path / "summary.json")
    return Run(
        path=path,
        config=config,
        summary=summary,
        cache_dir=cache_dir,
        compare_row=compare_row,
        winner_trial=winner_trial,
        selection=selection or summary.get("selection", ""),
        selection_detail=detail or (summary.get("selection_detail") if not selection else None),
    )


def read_json(path: Path, *, missing: dict | None = None) -> dict:
    """A run folder's JSON object, or one UserError naming the file (garbage, or not an object); `missing`: what a
    file that does not exist stands for (None: it must exist)."""
    if missing is not None and not path.is_file():
        return missing
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError(f"{path}: unreadable ({str(exc)[:120]}): not the file a run writes") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}: not the file a run writes")
    return data


def load_study(run: Run, data=None):
    """The run's Optuna study, read from its storage (a missing SQLite file is an error, never created), and the
    run's summary.json checked against it (`check_summary`; `data`: the run's task data, loaded when needed)."""
    from promptopt.study.storage import read_study

    study = read_study(run.config, where=str(run.path))
    check_summary(run, study, data)
    return study


# tie-breaks that read a candidate's prompt (its length, its decision rule): the winner needs the task data to decode
_PROMPT_TIE_BREAKS = ("cost", "calibrated", "argmax")


def check_summary(run: Run, study, data=None) -> None:
    """summary.json's winner and selection, recomputed from the study: the file is in the run's table set, but a
    forger can recompute tables.json, not the study. The best trial must be a finished trial of the study with the
    recorded parameters, and the one the run's selection rule chooses from the study's trials (the same rule and
    candidates `write_outputs` uses), with the same selection sentence and record. One UserError naming
    summary.json otherwise."""
    from optuna.trial import TrialState

    from promptopt.study import get_strategy
    from promptopt.study.outputs import choose_shipped

    path, summary, config = run.path / "summary.json", run.summary, run.config
    forged = "the file was changed after the run, or the study was; export and report trust neither"
    number = summary.get("best_trial")
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or trial.state != TrialState.COMPLETE:
        state = "no trial of the study" if trial is None else f"a {trial.state.name} trial"
        raise UserError(f"{path}: best_trial {str(number)[:20]} is {state}: {forged}")
    if summary.get("best_params") != trial.params:
        raise UserError(f"{path}: best_params are not trial {number}'s parameters in the study: {forged}")
    strategy = get_strategy(config.study.strategy)
    tie_break = config.study.tie_break or strategy.tie_break
    ctx = None
    if data is not None or tie_break in _PROMPT_TIE_BREAKS:
        from promptopt.study.context import build_context

        ctx = build_context(config, data if data is not None else config.data.load(), None)
    try:
        shipped, selection, detail, *_ = choose_shipped(
            study, strategy, tie_break=config.study.tie_break, seed=config.study.seed, ctx=ctx
        )
    except ValueError:  # a study recorded before trials kept their per-item dev answers: nothing to recompute
        return
    if shipped["number"] != number:
        raise UserError(
            f"{path}: names trial {number} as the winner, but the run's selection rule chooses trial "
            f"{shipped['number']} from the study: {forged}"
        )
    recomputed = {"selection": selection, "selection_detail": detail}
    recorded = {key: summary[key] for key in recomputed if key in summary}  # a run older than the rule has neither
    if _canonical(recorded) != _canonical({key: recomputed[key] for key in recorded}):
        raise UserError(f"{path}: its selection text or record is not what the study's trials give: {forged}")


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def check_splits(run: Run, data) -> dict:
    """The run's carving: splits.json as written by the search, checked against what the task data carves now
    (`data`: the run's task data). A missing file is recomputed; garbage or a mismatch is one UserError naming it."""
    path = run.path / "splits.json"
    carving = data.carving()
    written = read_json(path, missing=carving)
    if _canonical(written) != _canonical(carving):
        differs = next((k for k in ("task", "seed", "pool", "dev", "test") if written.get(k) != carving.get(k)), "keys")
        raise UserError(
            f"{path}: its {differs} differ from what the task data carves now (the task's data or seed changed "
            "since the run, or the file was changed)"
        )
    return carving


def pick_trial(run: Run, study, trial: int | None):
    """The winner (summary.json's best trial) or trial `trial`, which must have finished."""
    from optuna.trial import TrialState

    number = winner_number(run) if trial is None else trial
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found:
        numbers = sorted(t.number for t in study.get_trials(deepcopy=False))
        span = f"trials {numbers[0]}–{numbers[-1]}" if numbers else "no trials"
        raise UserError(f"--trial {number}: study '{study.study_name}' in {run.path} has no such trial ({span})")
    chosen = found[0]
    if chosen.state not in (TrialState.COMPLETE, TrialState.PRUNED):
        raise UserError(
            f"--trial {number}: trial {number} of study '{study.study_name}' is {chosen.state.name}, not finished"
        )
    return chosen


def winner_number(run: Run) -> int:
    """The run's winner: the trial compare chose, else the study's best (summary.json)."""
    return run.winner_trial if run.winner_trial is not None else run.summary.get("best_trial")


def decode_trial(run: Run, data, params: dict) -> Prompt:
    """The prompt a trial's parameters stand for, decoded by the run's own search space (and exemplar
    candidates). The study's best trial must reproduce the run's best_card.yaml, or nothing is exported."""
    from promptopt.prompts import load_card
    from promptopt.study import decode_params

    prompt = decode_params(run.config, data, params)
    best_card = run.path / "best_card.yaml"
    if params == run.summary.get("best_params") and best_card.is_file() and load_card(best_card)[0] != prompt:
        raise UserError(
            f"{run.path}: trial {run.summary.get('best_trial')} decodes to a prompt other than best_card.yaml "
            "(the task data or search space changed since the run)"
        )
    return prompt


def instruction_provenance(config, data, params: dict) -> dict | None:
    """Where a trial's instruction came from, when `promptopt propose` wrote it (the space's proposals block)."""
    from promptopt.study.space import load_space

    name = str(params.get("instruction"))
    proposed = load_space(config.study.space or data.spec.name).proposals.get(name)
    return clean({"name": name, **proposed}) if proposed else None
