"""`export_run`, top to bottom: pick a trial of a finished run by dev numbers only, build its card and write it in
the asked format, with the warnings a user should read before trusting it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from promptopt import progress
from promptopt.errors import UserError
from promptopt.prompts import Prompt
from promptopt.workflows.export.build import build_card
from promptopt.workflows.export.fragility import compare_test_items
from promptopt.workflows.export.measure import clean, robustness_section
from promptopt.workflows.export.robust import select_robust
from promptopt.workflows.export.runs import (
    Run,
    check_splits,
    decode_trial,
    instruction_provenance,
    load_study,
    open_run,
    pick_trial,
    read_json,
    winner_number,
)
from promptopt.workflows.export.select import EXPORT_SELECTIONS, compare_candidates, is_compare_dir, strategy_rows
from promptopt.workflows.session import Session
from promptopt.yamlio import check_output

FORMATS = ("card", "messages", "text", "lm-eval")


@dataclass
class Exported:
    card: dict
    paths: list[Path]
    run: Run
    trial: int
    warnings: list[str]
    default: dict | None = None  # the task's default prompt on the same test items: n, accuracy, item_ids, correct

    @property
    def card_path(self) -> Path:
        """The file written (the card, or the derived format asked for)."""
        return self.paths[0]


def export_run(
    run_dir: str | Path,
    *,
    out: str | Path,
    strategy: str | None = None,
    trial: int | None = None,
    fmt: str = "card",
    device: str | None = None,
    select: str = "dev",
    ensemble: int | None = None,
    ensemble_objective: str = "accuracy",
    flag_rate: float | None = None,
    flag_signal: str = "auto",
    tie_break: str | None = None,
) -> Exported:
    """Pick a trial of a finished run by dev numbers only (`select`: dev accuracy, or robust: dev Acc_worst among the
    trials as accurate as the best), build its card (measured on the run's dev and test items: the test numbers
    stay a held-out estimate) and write `out` in format `fmt` (card, messages, text or lm-eval). `flag_rate`: a
    fragility threshold flagging that share of the dev answers (export/fragility.py), its signal `flag_signal` or
    the best on dev."""
    from promptopt.workflows import formats

    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if select not in EXPORT_SELECTIONS:
        raise UserError(f"--select {select}: expected one of {', '.join(EXPORT_SELECTIONS)}")
    if tie_break is not None:
        from promptopt.metrics.stats.selection import check_tie_break

        check_tie_break(tie_break)
        if select == "robust":
            raise UserError(f"--tie-break {tie_break}: --select robust breaks ties by dev Acc_worst; drop one of them")
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file name")
    check_output(out, folder=False, what="--out")  # before the card is measured
    root, session = Path(run_dir), None
    flag = _flag_request(root, flag_rate, flag_signal)
    if (
        root / "rounds.json"
    ).is_file():  # search --rounds: the last round's winner (each round starts from the previous best)
        try:
            last = int(read_json(root / "rounds.json")["rounds"][-1]["round"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise UserError(
                f"{root / 'rounds.json'}: no rounds recorded: not the file `search --rounds` writes"
            ) from None
        root = root / f"round{last}"
    if ensemble is not None:
        return _export_ensemble(root, out, ensemble, ensemble_objective, strategy, trial, fmt, device, select, flag)
    if select == "robust":
        if not is_compare_dir(root):
            raise UserError(
                f"--select robust: {root} is not a compare directory (a search run has one winner; pass --trial to pick another)"
            )
        if trial is not None:
            raise UserError("--select robust chooses the trial itself; drop --trial")
        pick, session = select_robust(root, strategy_rows(compare_candidates(root), strategy, root), device=device)
        run = open_run(root, pick=pick)
    else:
        run = open_run(root, strategy=strategy, tie_break=tie_break)
    config = run.config if device is None else run.config.replace(device=device)
    session = session or Session(model=config.model, data=config.data, out=run.cache_dir, batch_size=config.batch_size)
    study = load_study(run, session.data)  # summary.json checked against the study
    carving = check_splits(run, session.data)  # splits.json against the task data
    chosen = pick_trial(run, study, trial)
    progress.step(f"trial {chosen.number} of {run.path} ({run.selection or 'named by --trial'})")
    prompt = decode_trial(run, session.data, chosen.params)
    winner = chosen.number == winner_number(run)
    selection = run.selection if trial is None else f"trial {trial}, named by the user (--trial)"
    search = {
        "run_dir": str(run.path),
        "strategy": config.study.strategy,
        "study": config.name,
        "trial": chosen.number,
        "seed": config.study.seed,
        "winner": winner,
        "selection": selection,
        "params": clean(dict(chosen.params)),
    }
    if trial is None and run.selection_detail:  # which candidates tied, and why the tie-break chose this one
        search["selection_rule"] = clean(run.selection_detail)
    proposed = instruction_provenance(config, session.data, chosen.params)
    if proposed:
        search["instruction_provenance"] = proposed
    progress.step(
        f"measuring the card on {len(session.items('dev'))} dev and {len(session.items('test'))} test items "
        "(the run's result cache answers what the search scored)"
    )
    card = build_card(
        session,
        prompt,
        dev_items=session.items("dev"),
        test_items=session.items("test"),
        search=search,
        robustness=robustness_section(run.compare_row, compare_families(run)) if winner else None,
        carving=carving,
        flag=flag,
        flag_test=compare_test_items(run) if flag is not None and winner else None,
    )
    paths = formats.write(card, fmt, out, items=session.items("test"))
    default, warnings = _checked(session, card, run, prompt, fmt)
    return Exported(card=card, paths=paths, run=run, trial=chosen.number, warnings=warnings, default=default)


def _checked(session: Session, card: dict, run: Run, prompt: Prompt, fmt: str) -> tuple[dict, list[str]]:
    """The task's default prompt on the card's test items and the warnings: every export path (a winner, a named
    trial, --select robust, a rounds run, --ensemble, every format) ends here, so none ships a card worse than the
    default prompt without saying so."""
    progress.step(f"the task's default prompt on the same {len(session.items('test'))} test items (warnings)")
    default = default_answers(session)
    warnings = warnings_for(session, card, run, prompt, default)
    rule = card.get("decision", {}).get("rule", "argmax")
    members = (card.get("ensemble") or {}).get("members") or []
    if fmt in ("messages", "text") and members:
        warnings.append(
            f"--format {fmt} holds the first of the ensemble's {len(members)} prompts only: the recorded accuracy is "
            "the ensemble's (serve --format card with promptopt.load_prompt), not this prompt's"
        )
    elif fmt in ("messages", "text") and rule != "argmax":
        warnings.append(
            f"--format {fmt} holds the prompt only: decide its answers by the card's {rule} rule "
            "(promptopt.load_prompt(card).decide), else the recorded accuracy does not hold"
        )
    return default, warnings


def _flag_request(root: Path, rate: float | None, signal: str):
    """The FlagRequest of `--flag-rate` (None without it): under the compare's recorded search suite, else cheap."""
    from promptopt.workflows.export.fragility import FlagRequest

    if rate is None:
        if signal != "auto":
            raise UserError("--flag-signal needs --flag-rate (the share of dev answers to flag)")
        return None
    marker = root / "search_suite.json"
    suite = read_json(marker, missing={}).get("name")
    return FlagRequest(rate=rate, signal=signal, suite=suite)


def _export_ensemble(root, out, k, objective, strategy, trial, fmt, device, select, flag=None) -> Exported:
    """`--ensemble K`: members chosen on dev among the run's finished trials (export/ensemble.py)."""
    from promptopt.workflows import formats
    from promptopt.workflows.export.ensemble import choose_ensemble, search_runs

    if k < 2:
        raise UserError(f"--ensemble {k}: an ensemble has at least 2 members")
    if trial is not None or select != "dev":
        raise UserError("--ensemble chooses its members itself on dev: drop --trial / --select")
    if fmt == "lm-eval":
        raise UserError(
            "--format lm-eval cannot express an ensemble (lm-eval scores one prompt per task): export a member "
            "with --trial, or write --format card"
        )
    runs = search_runs(root, strategy)
    config = runs[0].config if device is None else runs[0].config.replace(device=device)
    session = Session(model=config.model, data=config.data, out=runs[0].cache_dir, batch_size=config.batch_size)
    dev_items, test_items = session.items("dev"), session.items("test")
    progress.step(f"choosing {k} members on {len(dev_items)} dev items (greedy forward selection)")
    chosen = choose_ensemble(runs, session, dev_items, k, objective)
    progress.step(f"measuring the ensemble on {len(dev_items)} dev and {len(test_items)} test items")
    first_prompt, first = chosen["members"][0]
    search = {
        "run_dir": str(root),
        "strategy": f"ensemble of {k}",
        "study": first["study"],
        "trial": first["trial"],
        "seed": first["seed"],
        "winner": False,
        "selection": chosen["selection"],
    }
    card = build_card(
        session, first_prompt, dev_items=dev_items, test_items=test_items, search=search, ensemble=chosen, flag=flag
    )
    paths = formats.write(card, fmt, Path(out), items=test_items)
    default, warnings = _checked(session, card, runs[0], first_prompt, fmt)
    return Exported(card=card, paths=paths, run=runs[0], trial=first["trial"], warnings=warnings, default=default)


def compare_families(run: Run) -> dict | None:
    """families_seen / families_unseen of the compare a run belongs to (its summary.json), and n_robust: how many
    test items were stressed, if any."""
    path = run.cache_dir / "summary.json"
    if run.compare_row is None or not path.is_file():
        return None
    summary = read_json(path)
    return {key: summary.get(key) for key in ("families_seen", "families_unseen", "n_robust")}


MIN_CLEAN_CORRECT = 20  # fewer clean-correct items than this and a PDR is mostly noise


def default_answers(session: Session) -> dict:
    """The task's default prompt on the session's test items: n, accuracy, and the per-item answers (item_ids,
    correct) a reader pairs with the card's (`report`'s recommendation does)."""
    table = session.scorer.score(session.data.default_prompt(), session.items("test")).table
    return {
        "n": len(table),
        "accuracy": float(table["correct"].mean()),
        "item_ids": [str(i) for i in table["item_id"]],
        "correct": [bool(c) for c in table["correct"]],
    }


def warnings_for(session: Session, card: dict, run: Run, prompt: Prompt, default: dict | None = None) -> list[str]:
    """What a user should know before trusting the card (read, never used to choose): it is no better than the
    task's default prompt on the same test items, or its PDR rests on few clean-correct items. `export` prints
    them and `report` shows them, from this one function."""
    test_items = session.items("test")
    default = default_answers(session) if default is None else default
    default, ours = default["accuracy"], card["metrics"]["test"]["accuracy"]
    out = []
    if ours <= default:
        out.append(
            f"the exported prompt is not better than the task's default prompt on the same {len(test_items)} test "
            f"items ({ours:.3f} vs {default:.3f})"
        )
    if (card.get("fragility") or {}).get("warning"):
        out.append(f"fragility flag: {card['fragility']['warning']}")
    if prompt == session.data.default_prompt():  # the search kept the prompt it started from: say why
        kept = (run.summary.get("incumbent") or {}).get("why")
        out.append(
            "the card is the task's default prompt"
            + (f": {kept}" if kept else " (no searched prompt was chosen over it)")
        )
    robust = card["metrics"].get("robustness")
    n_robust = read_json(run.cache_dir / "summary.json", missing={}).get("n_robust")
    if robust and robust.get("pdr") is not None and n_robust:
        clean_correct = int(session.scorer.score(prompt, test_items[:n_robust]).table["correct"].sum())
        if clean_correct < MIN_CLEAN_CORRECT:
            out.append(
                f"its PDR ({robust['pdr']:.3f}) rests on {clean_correct} clean-correct items (fewer than {MIN_CLEAN_CORRECT}): "
                "read it with its interval"
            )
    return out
