"""`search --propose N` and `search --rounds R`: searches over spaces that grow with proposed instructions.

One round (`--propose N`): N proposals (any mode but `history`) join the space, written to
`<out>/space.yaml`, and one study searches it; the run directory is a plain search run.

R rounds (OPRO-style): round 0 searches the space (with `--propose N` proposals of a non-history mode
added); round r ≥ 1 proposes N instructions in `history` mode from round r−1's instructions with their best
dev accuracy, listed worst first, and searches the grown space in its own study (`<name>-round<r>`, all in
one storage), starting from round r−1's card as its incumbent (study/incumbent.py: kept unless a searched prompt
beats it on dev, paired; with `--incumbent none`, warm-started with round r−1's best parameters instead), so a round
can only keep or beat its predecessor. Each round is a run directory `<out>/round<r>/`; `<out>` holds
one trials table over all rounds (column `round`), `rounds.json`, and the last round's winning card.
Proposals are cached in `<out>/proposals/`, so `--resume` rebuilds the same spaces and joins the same studies.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from promptopt.errors import ConfigError, UserError
from promptopt.study import may_run, run_search, study_exists
from promptopt.study.config import default_storage_url
from promptopt.study.space import load_space
from promptopt.workflows.propose.proposer import Proposals, ProposeRequest
from promptopt.workflows.propose.workflow import propose_space
from promptopt.workflows.session import Session
from promptopt.yamlio import atomic_write_text, check_output, write_parquet_and_csv

SPACE_FILE = "space.yaml"
PENDING = "space.yaml.pending"  # a proposed space before its study may run (settle_space)
PROPOSALS_DIR = "proposals"


@dataclass
class RoundsResult:
    rounds: list  # SearchResult per round
    proposals: list[Proposals | None]  # what joined the space at each round (None: nothing proposed)
    trials: pd.DataFrame  # every round's trials, column `round`
    card_path: Path


def search_with_proposals(config, request: ProposeRequest, *, expand=None, show_progress: bool = True):
    """One study over the space plus `request.n` proposals -> (SearchResult, Proposals)."""
    if request.mode == "history":
        raise ConfigError(
            "--propose-mode history proposes from a search's scored history: use search --rounds R (R ≥ 2)"
        )
    out = Path(config.out)
    check_output(out, folder=True, what="--out")
    session = Session(model=config.model, data=config.data, out=out, batch_size=config.batch_size)
    proposed = propose_space(
        session, request, space=config.study.space, out=_new_dir(out) / PENDING, cache_dir=out / PROPOSALS_DIR
    )
    config = settle_space(proposed.path, out / SPACE_FILE, config, session.data, expand)
    result = run_search(config, scorer=session.scorer, expand=expand, show_progress=show_progress)
    return result, proposed.proposals


def settle_space(pending: Path, final: Path, config, data, expand, *, may_create: bool = False):
    """Put a proposed space file in place only once the study that will search it may run: it exists exactly
    when --resume says so (`may_create`: a missing one may be created, as later rounds are), and a resumed one
    means the same thing with this space. A refused run leaves the space file it had untouched. -> the config
    pointing at `final`."""
    try:
        exists = may_run(config.replace(space=str(pending)), data, expand, may_create=may_create)
    except BaseException:
        pending.unlink(missing_ok=True)
        raise
    os.replace(pending, final)
    return config.replace(space=str(final), resume=exists)


def history_of(result, space) -> list[tuple[str, str, float]]:
    """(name, text, best dev accuracy) of each instruction a finished round tried (complete trials only)."""
    trials = result.trials
    done = trials[trials["state"] == "COMPLETE"]
    best: dict[str, float] = {}
    for _, row in done.iterrows():
        metrics = row.get("user_attrs_metrics")
        accuracy = metrics.get("accuracy") if isinstance(metrics, dict) else None
        name = row.get("params_instruction")
        if accuracy is not None and isinstance(name, str):
            best[name] = max(best.get(name, float("-inf")), float(accuracy))
    return [(name, space.instructions[name], value) for name, value in best.items() if name in space.instructions]


def search_rounds(
    config, request: ProposeRequest, *, rounds: int, expand=None, show_progress: bool = True
) -> RoundsResult:
    """`rounds` studies, each over the previous round's space plus `request.n` history proposals."""
    if rounds < 2:
        raise ConfigError(f"--rounds: expected at least 2 (one round is a plain search), got {rounds}")
    out = Path(config.out)
    check_output(out, folder=True, what="--out")
    storage = config.study.storage or default_storage_url(out)
    session = Session(model=config.model, data=config.data, out=out, batch_size=config.batch_size)
    space, results, proposals = config.study.space, [], []
    for r in range(rounds):
        run_dir = out / f"round{r}"
        round_config = config.replace(
            out=str(run_dir), storage=storage, study_name=f"{config.name}-round{r}", space=space
        )
        made = None
        if r == 0 and request.mode != "history":
            made = propose_space(
                session,
                dataclasses.replace(request, round=0),
                space=space,
                out=_new_dir(run_dir) / PENDING,
                cache_dir=out / PROPOSALS_DIR,
            )
        elif r > 0:
            history = history_of(results[-1], load_space(space or session.data.spec.name))
            if not history:
                raise UserError(
                    f"search --rounds: round {r - 1} completed no trial, so round {r} has no scored instruction to "
                    "propose from (more --trials, or --no-pruning)"
                )
            made = propose_space(
                session,
                dataclasses.replace(request, mode="history", round=r),
                space=space,
                out=_new_dir(run_dir) / PENDING,
                cache_dir=out / PROPOSALS_DIR,
                history=history,
            )
        if made is not None:
            round_config = settle_space(
                made.path, run_dir / SPACE_FILE, round_config, session.data, expand, may_create=r > 0
            )
            space = round_config.study.space
        else:
            exists = study_exists(round_config, session.data, expand)
            round_config = round_config.replace(resume=bool(config.study.resume and exists))
        proposals.append(made.proposals if made is not None else None)
        warm = (results[-1].best_params,) if results else ()
        if results and config.study.incumbent != "none":  # round r starts from round r−1's card: its incumbent
            round_config, warm = round_config.replace(incumbent=str(results[-1].card_path)), ()
        results.append(
            run_search(round_config, scorer=session.scorer, expand=expand, show_progress=show_progress, enqueue=warm)
        )
    trials = pd.concat([res.trials.assign(round=r) for r, res in enumerate(results)], ignore_index=True)
    write_parquet_and_csv(trials, out / "trials")
    card = out / "best_card.yaml"
    atomic_write_text(card, results[-1].card_path.read_text(encoding="utf-8"))
    summary = [
        {
            "round": r,
            "study": res.config.name,
            "space": res.config.study.space,
            "best_trial": res.best_number,
            "best_instruction": res.best_params.get("instruction"),
            "dev_accuracy": res.dev["accuracy"],
            "test_accuracy": res.test["accuracy"],
            "search_seconds": res.wall_seconds,
            "proposed": [{"name": p.name, "text": p.text} for p in (made.accepted if made else [])],
            "drops": made.drops if made else {},
        }
        for r, (res, made) in enumerate(zip(results, proposals))
    ]
    atomic_write_text(
        out / "rounds.json",
        json.dumps(
            {
                "study": config.name,
                "rounds": summary,
                "selection": "the last round's winner (each round starts from the previous best; dev numbers only)",
            },
            indent=1,
            default=str,
        ),
    )
    return RoundsResult(results, proposals, trials, card)


def _new_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


__all__ = ["RoundsResult", "search_rounds", "search_with_proposals"]
