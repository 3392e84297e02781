"""A finished study's run directory: the trials table, the winner re-scored on dev and test, its card, the
summary, and the strategy's ranking of distinct trials (what `compare --top-n` evaluates). The files are one
table set (study/tableset.py): tables.json, written last, tells readers the set is complete."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from promptopt.metrics.stats.selection import decode_answers, encode_answers
from promptopt.scoring.stored import answer_columns
from promptopt.study.config import redact
from promptopt.study.context import SearchContext, SearchResult, decode, note
from promptopt.study.incumbent import find as find_incumbent
from promptopt.study.incumbent import is_incumbent, replacement
from promptopt.study.recovery import fault_point
from promptopt.study.strategies import select_winner, selection_of
from promptopt.study.tableset import TableSet
from promptopt.study.trial import is_duplicate


def write_outputs(ctx: SearchContext, study, cached, wall: float, hits_before: int, misses_before: int) -> SearchResult:
    """trials table, winner re-scored on dev and test, card and summary: each file written atomically, the set
    sealed by tables.json last."""
    from promptopt.prompts import save_card
    from promptopt.scoring import summarize

    config, out = ctx.config, Path(ctx.config.out)
    trials = study.trials_dataframe(
        attrs=(
            "number",
            "value" if not ctx.strategy.multi_objective else "values",
            "state",
            "params",
            "user_attrs",
            "duration",
        )
    )
    trials = _named_partial_values(trials)
    tables = TableSet(out, "search").begin()
    tables.frame("trials.parquet", trials)
    tables.frame("trials.csv", trials)
    pareto = None
    if ctx.strategy.multi_objective:
        front = study.best_trials
        pareto = pd.DataFrame(
            [{"number": t.number, "accuracy": t.values[0], "signed_stability": t.values[1], **t.params} for t in front]
        )
        tables.frame("pareto_front.parquet", pareto)
        tables.frame("pareto_front.csv", pareto)
    shipped, selection, detail, kept, incumbent, candidates = choose_shipped(
        study, ctx.strategy, tie_break=config.study.tie_break, seed=config.study.seed, ctx=ctx, cached=cached
    )
    winner = shipped
    best = next(t for t in study.trials if t.number == winner["number"])
    prompt = decode(ctx, best.params)
    pairs_scored = cached.cache.misses - misses_before  # the search's own cost, before the winner's test items
    fault_point("rescore")
    dev_table, test_table, rule = _winner_tables(ctx, cached, prompt)
    dev, test = summarize(dev_table), summarize(test_table)
    stored = answer_columns(test_table)  # gold and pred typed as `score --out` and compare's tables type them
    tables.frame("best_test_items.parquet", stored)
    tables.frame("best_test_items.csv", stored)
    fault_point("card")
    provenance = {
        "task": ctx.data.spec.name,
        "model": config.model.spec,
        "strategy": config.study.strategy,
        "study": config.name,
        "trial": best.number,
        "selection": selection,
        "tie_break": detail.get("tie_break"),
        "seed": config.study.seed,
        "dev": {k: dev[k] for k in ("n", "accuracy", "tcb_mean", "tcb_geomean", "ppl_mean")},
        "test": {k: test[k] for k in ("n", "accuracy", "tcb_mean", "tcb_geomean", "ppl_mean")},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if rule.calibrated:  # the parameters the test numbers were decided with, fit on the dev items
        provenance["decision_fitted"] = rule.to_card()
    proposed = ctx.space.proposals.get(str(best.params.get("instruction")))
    if proposed:  # a proposed instruction won: the card says who wrote it, how, and from what
        provenance["instruction_provenance"] = {"name": best.params["instruction"], **proposed}
    card_path = out / "best_card.yaml"
    save_card(prompt, card_path, provenance)
    tables.add(card_path.name)
    hits, misses = cached.cache.hits - hits_before, cached.cache.misses - misses_before
    hit_rate = hits / (hits + misses) if hits + misses else float("nan")
    duplicates = sum(is_duplicate(t) for t in study.get_trials(deepcopy=False))
    result = SearchResult(
        config,
        trials,
        best.params,
        best.number,
        prompt,
        dev,
        test,
        card_path,
        wall,
        hit_rate,
        pareto,
        selection=selection,
        selection_detail=detail,
        ranking=_ranking(ctx.strategy, candidates, winner, config.study.tie_break),
        duplicates_skipped=duplicates,
        pairs_scored=pairs_scored,
        incumbent=None
        if incumbent is None
        else {**detail.get("incumbent", {}), "trial": incumbent["number"], "kept": kept},
        scan=study.user_attrs.get("scan"),
        dev_items_spent=_dev_items_spent(study),
    )
    for entry in result.ranking:
        entry["prompt"] = decode(ctx, entry["params"])
    summary = {
        "study": config.name,
        "storage": redact(config.storage_url),
        "best_trial": best.number,
        "best_params": best.params,
        "selection": selection,
        "selection_detail": detail,
        "incumbent": result.incumbent,
        "scan": result.scan,
        "dev_items_spent": result.dev_items_spent,
        "budget": {"trials": config.study.trials, "minutes": config.study.budget_minutes},
        "dev": dev,
        "test": test,
        "wall_seconds": wall,
        "cache_hit_rate": result.cache_hit_rate,
        "trials": {s: int((trials["state"] == s).sum()) for s in trials["state"].unique()},
        "duplicates_skipped": duplicates,
        "pairs_scored": pairs_scored,
    }
    tables.text("summary.json", json.dumps(summary, indent=1, default=str))
    tables.seal()
    return result


def choose_shipped(study, strategy, *, tie_break: str | None, seed: int, ctx: SearchContext | None = None, cached=None):
    """What a finished study ships, from the study alone (the run's writer and export's check of summary.json call
    this one function): (shipped entry, the sentence saying why, the selection record, whether the incumbent was kept,
    the incumbent's entry or None, the searched candidates). `ctx` (and `cached`) add each prompt's cost and rule,
    which the cost/calibrated/argmax tie-breaks read."""
    trial = find_incumbent(study)
    candidates = _candidates(study, strategy, ctx, cached)
    incumbent = _entries([trial], strategy, ctx, cached)[0] if trial is not None else None
    return (*_ship(strategy, tie_break, seed, study, candidates, incumbent), incumbent, candidates)


def _ship(
    strategy, tie_break: str | None, seed: int, study, candidates: list[dict], incumbent: dict | None
) -> tuple[dict, str, dict, bool]:
    """(the shipped entry, the sentence saying why, the selection record, whether the incumbent was kept): the
    selection rule's winner among the searched trials, unless the incumbent exists and the winner does not beat it on
    dev by the replacement test (study/incumbent.py)."""
    if not candidates:
        if incumbent is None:
            raise ValueError("no finished trial to choose from")
        why = (
            f"kept {incumbent_label(study)}: no searched prompt finished on every dev item (each was pruned, or the "
            "scan stopped the search)"
        )
        return incumbent, why, {"why": why, "incumbent": {"replaced": False, "why": why}}, True
    chosen = selection_of(strategy, candidates, tie_break=tie_break)
    winner = next(c for c in candidates if c["number"] == chosen.winner.key)
    detail = chosen.record()
    if incumbent is None:
        return winner, chosen.describe(), detail, False
    binary = strategy.replace_on == "criterion"
    quantity = (lambda c: c.get("criterion") or c["correct"]) if binary else (lambda c: c["item_values"])
    test = replacement(
        quantity(winner),
        quantity(incumbent),
        binary=binary,
        winner_name=f"trial #{winner['number']}",  # "#N", as the selection rule names trials (readers map it)
        incumbent_name=incumbent_label(study),
        seed=seed,
    )
    detail["incumbent"] = test.record()
    if test.replaced:
        return winner, f"{chosen.describe()}; {test.why}", detail, False
    return incumbent, test.why, detail, True


def incumbent_label(study) -> str:
    trial = find_incumbent(study)
    return str(trial.user_attrs.get("incumbent", "the incumbent")) if trial is not None else "the incumbent"


def _dev_items_spent(study) -> dict:
    """Dev items scored per trial (user attr `dev_items`; the incumbent's included), and their sum; the scan's pairs
    and how many of them its prompts' own trials did not score again (`scan_extra`: what the scan cost beyond the
    search, a slice longer than where racing dropped the trial, or a trial the run never reached)."""
    trials = study.get_trials(deepcopy=False)
    per_trial = {t.number: int(t.user_attrs["dev_items"]) for t in trials if "dev_items" in t.user_attrs}
    scan = study.user_attrs.get("scan") or {}
    pairs = int(scan.get("pairs") or 0)
    slice_items = int(scan.get("n_items") or 0)
    reused = sum(min(slice_items, per_trial.get(t.number, 0)) for t in trials if t.user_attrs.get("scanned"))
    return {
        "per_trial": per_trial,
        "trials": sum(per_trial.values()),
        "scan_pairs": pairs,
        "scan_extra": max(0, pairs - reused),
    }


def _named_partial_values(trials: pd.DataFrame) -> pd.DataFrame:
    """A PRUNED trial's value is what it scored on the dev items it saw (`partial_value`; Optuna's own value is the
    same since trials report it last, study/trial.py `report_partial`, and was the last item's 0/1 in older studies):
    `value_over` says which items a row's value is over."""
    # single-objective: "value", or "value_<metric name>" once the study names its metric
    value = next((c for c in trials.columns if c == "value" or c.startswith("value_")), None)
    if value is None or "user_attrs_partial_value" not in trials:
        return trials
    pruned = trials["state"] == "PRUNED"
    trials = trials.copy()
    trials.loc[pruned, value] = trials.loc[pruned, "user_attrs_partial_value"]
    seen = trials.get("user_attrs_dev_items")
    trials["value_over"] = [
        (f"first {int(n)} dev items" if n == n else "the dev items it saw") if p else "every dev item"
        for p, n in zip(pruned, seen if seen is not None else [float("nan")] * len(trials))
    ]
    return trials


def _winner_tables(ctx: SearchContext, cached, prompt):
    """The winner's dev and test tables under its decision rule: dev decided as the trial decided it (fit on
    every dev item; affine cross-fitted), test by the rule fit on the dev items (what a card would ship)."""
    from promptopt.scoring.calibration import DecidingScorer, RunningDecision, fit_rule

    running = RunningDecision(cached, prompt, hidden=True)
    running.add(ctx.dev)
    rule = running.fitted()
    if not rule.calibrated:
        return running.decided(), cached.score_table(prompt, ctx.test), rule
    rule = fit_rule(rule, cached, prompt, ctx.dev) if rule.spec.fit_on != "content_free" else rule
    return running.decided(), DecidingScorer(cached, rule).score_table(prompt, ctx.test), rule


def _candidates(study, strategy, ctx: SearchContext | None = None, cached=None) -> list[dict]:
    """Finished trials as the selection rule sees them (the Pareto front for multi-objective studies): their dev
    numbers, per-item dev correctness (user attr `dev_correct`; a trial recorded before it existed is re-read
    through the result cache, `cached`), and, with the run's context, each prompt's cost and whether it decides
    by a calibrated rule."""
    from optuna.trial import TrialState

    trials = (
        study.best_trials
        if strategy.multi_objective
        else study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    )
    return _entries([t for t in trials if not is_incumbent(t)], strategy, ctx, cached)


def _entries(trials: list, strategy, ctx: SearchContext | None = None, cached=None) -> list[dict]:
    """Trials as the selection rule sees them (`_candidates`), with their per-item values (`item_values`: what the
    pruner was told, for the incumbent's replacement test by a continuous objective)."""
    out = []
    for t in trials:
        metrics = t.user_attrs.get("metrics", {})
        entry = {
            "number": t.number,
            "ordinal": t.user_attrs.get("ordinal", t.number),
            "params": t.params,
            "value": t.value if not strategy.multi_objective else None,
            "values": t.values,
            "accuracy": metrics.get("accuracy", float("nan")),
            "n": metrics.get("n", 0),
            "signed_stability": metrics.get("signed_stability", float("-inf")),
            "item_values": [t.intermediate_values[i] for i in sorted(t.intermediate_values)],
        }
        bits = t.user_attrs.get("dev_correct")
        prompt = decode(ctx, t.params) if ctx is not None else None
        if bits is None and prompt is not None and cached is not None:
            from promptopt.scoring.calibration import RunningDecision

            running = RunningDecision(cached, prompt)
            running.add(ctx.dev)
            bits = encode_answers(running.decided()["correct"].astype(bool))
        if decode_answers(bits) is None:
            raise ValueError(f"trial {t.number}: no per-item dev answers recorded (dev_correct) to choose with")
        entry["correct"] = decode_answers(bits)
        if strategy.criterion != "correct":  # what the strategy's tie set pairs on (robust: robust_correct)
            entry["criterion"] = decode_answers(t.user_attrs.get(f"dev_{strategy.criterion}"))
            if entry["criterion"] is None:
                raise ValueError(f"trial {t.number}: no per-item dev {strategy.criterion} recorded to choose with")
        if prompt is not None:
            entry["cost"] = prompt.characters
            entry["calibrated"] = prompt.decision not in ("argmax", None)
        out.append(entry)
    return out


def _ranking(strategy, candidates: list[dict], winner: dict, tie_break: str | None = None) -> list[dict]:
    """Trials in the order the strategy prefers them (the winner first, then by the same rule on the rest), one per
    distinct prompt: what `compare --top-n` evaluates."""
    rest = [c for c in candidates if c["number"] != winner["number"]]
    ranked = [winner]
    while rest:
        nxt, _ = select_winner(strategy, rest, tie_break=tie_break)
        ranked.append(nxt)
        rest = [c for c in rest if c["number"] != nxt["number"]]
    seen, distinct = set(), []
    for c in ranked:
        key = json.dumps(c["params"], sort_keys=True)
        if key not in seen:
            seen.add(key)
            distinct.append(c)
    return distinct


def report_leftovers(study, show: bool) -> None:
    """Trials still RUNNING when the budget is met belong to other processes: alive ones finish by
    themselves; if their process died, the next --resume re-runs them (after the grace period)."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if running and show:
        names = ", ".join(f"#{t.number} ({t.user_attrs.get('worker', '?')})" for t in running)
        note(True)(f"trial(s) {names} still RUNNING elsewhere; if their process died, --resume re-runs them")
