"""One trial: the sampled prompt scored on growing slices of the dev items (each item's value reported to the
racing pruner, study/racing.py), the incumbent scored as a trial first (study/incumbent.py), and the loop that runs
trials until the budget (trials, or minutes) is met.

A multi-fidelity strategy (`robust`; strategies.py says why) runs two rungs: the clean prompt on every dev
item with per-item clean correctness reported to the pruner, then, for a trial the pruner left alive, the
perturbed variants, scored only while the trial can still beat the incumbent (`cannot_win`). Such a trial
is PRUNED with user attr `rung` = "clean", "promotion" (its clean accuracy is not above the incumbent's
robust value, so no variant is scored) or "variants"; `partial_value` is then an upper bound of its value."""

from __future__ import annotations

import time

import pandas as pd

from promptopt.errors import PromptTooLongError, UserError
from promptopt.scoring.api import CachingScorer
from promptopt.scoring.calibration import RunningDecision
from promptopt.study.context import SearchContext, decode
from promptopt.study.recovery import counts, fault_point, give_back, pid_namespace, recover
from promptopt.study.storage import sampling_state

MAX_DUPLICATES_IN_A_ROW = 25  # samples that decode to evaluated prompts before a search stops as exhausted


class DuplicatePrompt(Exception):
    """The sampled point decodes to a prompt the study has evaluated: the trial is FAILed with user attr
    `duplicate_of` and not counted; the next trial samples afresh."""


def prompt_key(prompt) -> str:
    """What makes two prompts the same prompt: their card (instruction, template, shots in order)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(prompt.to_card(), sort_keys=True).encode()).hexdigest()[:16]


def evaluated_as(ctx: SearchContext, study, trial, key: str) -> int | None:
    """The number of a trial of the study that evaluated the prompt `key` (finished, or running with a lower
    number, so of two concurrent trials the later one is the duplicate), else None."""
    from optuna.trial import TrialState

    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)):
        if other.number == trial.number or (other.state == TrialState.RUNNING and other.number > trial.number):
            continue
        other_key = other.user_attrs.get("prompt_key")
        if other_key is None and other.state != TrialState.RUNNING:  # a study from before prompt keys were recorded
            other_key = prompt_key(decode(ctx, other.params))
        if other_key == key:
            return other.number
    return None


def is_duplicate(trial) -> bool:
    return trial.state.name == "FAIL" and "duplicate_of" in trial.user_attrs


def with_robust_correct(table: pd.DataFrame, groups, cached, *, lazy: bool = False) -> pd.DataFrame:
    """Add robust_correct: the item is right on the clean prompt and on every one of its variants.
    lazy: score a variant only while its item is still robust (right on the clean prompt and on every
    variant scored so far): the same column, fewer pairs."""
    ok = dict(zip(table["item_id"], table["correct"].astype(bool)))
    for variant_prompt, items in groups:
        todo = [i for i in items if ok[i.id]] if lazy else items
        if not todo:
            continue
        for item_id, correct in zip([i.id for i in todo], cached.score_table(variant_prompt, todo)["correct"]):
            ok[item_id] = ok[item_id] and bool(correct)
    return table.assign(robust_correct=table["item_id"].map(ok).astype(bool))


def incumbent(study, n: int) -> tuple[int, int] | None:
    """(robust count on the n dev items, trial number) of the study's best COMPLETE trial, or None."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    return round(best.value * n), best.number


def cannot_win(upper: int, best: tuple[int, int] | None, number: int) -> bool:
    """A trial whose value is at most upper/n cannot be chosen over the incumbent (`best_value` breaks ties
    by the lower trial number)."""
    if best is None:
        return False
    count, best_number = best
    return upper < count or (upper == count and best_number < number)


def trial_summary(table: pd.DataFrame) -> dict:
    from promptopt.scoring import summarize
    from promptopt.study.strategies import signed_stability

    s = summarize(table)
    keys = ("accuracy", "tcb_mean", "tcb_median", "tcb_geomean", "v_eff_mean", "ppl_mean", "n")
    out = {k: s[k] for k in keys if k in s}
    out["signed_stability"] = float(signed_stability(table).mean())
    out["answer_nll_mean"] = float(table["answer_nll"].mean()) if "answer_nll" in table else float("nan")
    if "robust_correct" in table:
        out["robust_accuracy"] = float(table["robust_correct"].mean())
    return out


def answer_attrs(table: pd.DataFrame) -> dict:
    """A finished trial's per-item dev answers, in dev order, "+" right and "-" wrong: `dev_correct` (clean correctness,
    what every selection pairs on) and, for `robust`, `dev_robust_correct` (its criterion: study/strategies.py). The
    selection rule pairs trials on them (metrics/stats/selection.py)."""
    from promptopt.metrics.stats.selection import encode_answers

    attrs = {"dev_correct": encode_answers(table["correct"].astype(bool))}
    if "robust_correct" in table:
        attrs["dev_robust_correct"] = encode_answers(table["robust_correct"].astype(bool))
    return attrs


def record_answers(trial, table: pd.DataFrame) -> None:
    """`answer_attrs` as the trial's user attrs."""
    for key, value in answer_attrs(table).items():
        trial.set_user_attr(key, value)


def add_incumbent(ctx: SearchContext, study, cached: CachingScorer):
    """Score the incumbent on every dev item (once per study: a resumed study keeps its own) and add it as a COMPLETE
    trial; None when the run has no incumbent. A resumed study whose incumbent is another prompt is refused."""
    import optuna

    from promptopt.study.incumbent import INCUMBENT_PARAM, find, label

    prompt = ctx.incumbent
    if prompt is None:
        return None
    key = prompt_key(prompt)
    existing = find(study)
    if existing is not None:
        if existing.user_attrs.get("prompt_key") != key:
            raise UserError(
                f"--resume: study '{study.study_name}' started from another incumbent prompt "
                f"({existing.params[INCUMBENT_PARAM]}); resume with the same --incumbent, or start a new study"
            )
        return existing
    strategy = ctx.strategy
    running = RunningDecision(cached, prompt, hidden=strategy.reads_tcb)
    running.add(ctx.dev)
    table = running.decided()
    if strategy.needs_variants:
        table = with_robust_correct(table, ctx.expand(cached, prompt, ctx.dev), running.scorer_for_variants())
    reported = strategy.screen_values(table) if strategy.multi_fidelity else strategy.item_values(table)
    values = strategy.values(table)
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        params={INCUMBENT_PARAM: ctx.config.study.incumbent},
        distributions={INCUMBENT_PARAM: optuna.distributions.CategoricalDistribution([ctx.config.study.incumbent])},
        **({"values": list(values)} if strategy.multi_objective else {"value": values[0]}),
        intermediate_values={} if reported is None else {i: float(v) for i, v in enumerate(reported)},
        user_attrs={
            **answer_attrs(table),
            "incumbent": label(ctx.config.study.incumbent, ctx.config.study.decision),
            "prompt_key": key,
            "metrics": trial_summary(table),
            "dev_items": len(ctx.dev),
            "ordinal": -1,
        },
    )
    fault_point("incumbent")
    study.add_trial(trial)
    return find(study)


def make_objective(ctx: SearchContext, cached: CachingScorer, worker: str):
    """The trial function; `objective.current` is the id of the trial it is running (for `give_back`)."""
    strategy, space = ctx.strategy, ctx.space
    minibatch = ctx.config.study.minibatch

    def objective(trial):
        objective.current = trial._trial_id
        trial.set_user_attr("worker_pidns", pid_namespace())  # first: the process that owns the trial (recover)
        trial.set_user_attr("worker", worker)
        trial.set_user_attr("ordinal", sampling_state(trial.study, trial)[0])  # its place in the sampled sequence
        fault_point("ask")
        # the parameters are stored before any scoring; --decision (the run's one rule) decides every trial
        prompt = space.suggest(trial, ctx.candidates, ctx.data.spec, ctx.config.study.decision)
        key = prompt_key(prompt)
        trial.set_user_attr("prompt_key", key)
        trial.set_user_attr("exemplars", [ex.id for ex in prompt.exemplars])
        same = evaluated_as(ctx, trial.study, trial, key)
        if same is not None:
            trial.set_user_attr("duplicate_of", same)
            raise DuplicatePrompt(f"trial {trial.number} decodes to the prompt of trial {same}")
        decider = RunningDecision(cached, prompt, hidden=strategy.reads_tcb)
        if strategy.multi_fidelity:
            return multi_fidelity_value(ctx, cached, trial, prompt, decider)
        frames = []
        for start, end in slices(len(ctx.dev), minibatch):
            batch = ctx.dev[start:end]
            table = decider.add(batch)
            if strategy.needs_variants:
                table = with_robust_correct(table, ctx.expand(cached, prompt, batch), decider.scorer_for_variants())
            frames.append(table)
            if start == 0:
                fault_point("trial")
            if strategy.multi_objective:
                continue
            for offset, value in enumerate(strategy.item_values(table)):
                trial.report(float(value), step=start + offset)  # one step per dev item: paired pruning
            if end < len(ctx.dev) and trial.should_prune():
                partial = pd.concat(frames, ignore_index=True) if strategy.needs_variants else decider.decided()
                _record_reason(trial)
                raise _prune(trial, partial, float(strategy.item_values(partial).mean()), len(ctx.dev))
        full = pd.concat(frames, ignore_index=True) if strategy.needs_variants else decider.decided()
        trial.set_user_attr("metrics", trial_summary(full))
        trial.set_user_attr("dev_items", len(ctx.dev))
        record_answers(trial, full)
        values = strategy.values(full)
        return values if strategy.multi_objective else values[0]

    objective.current = None
    return objective


def slices(n_items: int, first: int) -> list[tuple[int, int]]:
    """(start, end) of the growing dev slices a trial is scored on (study/racing.py `slice_ends`)."""
    from promptopt.study.racing import slice_ends

    ends = slice_ends(n_items, first)
    return list(zip([0, *ends[:-1]], ends))


def _record_reason(trial) -> None:
    """Why the pruner stopped the trial (the racing rule's line), as user attr `pruned_because`."""
    reason = getattr(trial.study.pruner, "reasons", {}).get(trial.number)
    if reason:
        trial.set_user_attr("pruned_because", reason)


def report_partial(trial, value: float, n_items: int) -> None:
    """A pruned trial's value on the items it saw, reported at step `n_items` (one past the last dev item) just
    before it is pruned. Optuna stores a pruned trial's last report as its value, and TPE ranks pruned trials by their
    last step, then that value: without this both were the last item's 0/1, so the sampler learnt nothing from a
    trial racing dropped. The racing pruner reads steps 0..k−1 only (study/racing.py `_values`)."""
    trial.report(float(value), step=n_items)


def _prune(trial, table: pd.DataFrame, value: float, n_items: int, rung: str | None = None):
    """The TrialPruned to raise, the trial's record written first: its metrics and value on the `table` it was
    scored on (of `n_items` dev items), and the multi-fidelity rung it stopped at."""
    import optuna

    trial.set_user_attr("metrics", trial_summary(table))
    trial.set_user_attr("dev_items", len(table))
    if rung is not None:
        trial.set_user_attr("rung", rung)
    trial.set_user_attr("partial_value", value)
    report_partial(trial, value, n_items)
    return optuna.TrialPruned()


def multi_fidelity_value(ctx: SearchContext, cached: CachingScorer, trial, prompt, decider: RunningDecision) -> float:
    """A multi-fidelity trial (module docstring): clean rung under the pruner, then the variants while the
    trial can still beat the incumbent. Returns the strategy's value on every dev item, or raises TrialPruned."""
    strategy, dev, minibatch = ctx.strategy, ctx.dev, ctx.config.study.minibatch
    n, pruning = len(dev), ctx.config.study.pruning
    frames = []
    for start, end in slices(n, minibatch):  # rung 1: the clean prompt, per-item screen values to the racing pruner
        table = decider.add(dev[start:end])
        frames.append(table)
        if start == 0:
            fault_point("trial")
        for offset, value in enumerate(strategy.screen_values(table)):
            trial.report(float(value), step=start + offset)
        if end < n and trial.should_prune():
            partial = pd.concat(frames, ignore_index=True)
            _record_reason(trial)
            raise _prune(trial, partial, float(strategy.screen_values(partial).mean()), n, "clean")
    clean = decider.decided()
    variant_scorer = decider.scorer_for_variants()
    open_items = int(clean["correct"].astype(bool).sum())  # clean-correct items whose variants are not scored yet
    if pruning and cannot_win(open_items, incumbent(trial.study, n), trial.number):
        raise _prune(trial, clean, open_items / n, n, "promotion")  # upper bounds: robust_i <= correct_i
    robust, frames = 0, []
    for start in range(0, n, minibatch):  # rung 2: variants of the clean-correct items, while the trial can win
        batch, table = dev[start : start + minibatch], clean.iloc[start : start + minibatch]
        groups = (
            ctx.expand(cached, prompt, batch) if table["correct"].astype(bool).any() else []
        )  # whole batch: same variants
        table = with_robust_correct(table, groups, variant_scorer, lazy=True)
        frames.append(table)
        robust += int(table["robust_correct"].sum())
        open_items -= int(table["correct"].astype(bool).sum())
        if (
            start + minibatch < n
            and pruning
            and cannot_win(robust + open_items, incumbent(trial.study, n), trial.number)
        ):
            raise _prune(trial, clean, (robust + open_items) / n, n, "variants")
    full = pd.concat(frames, ignore_index=True)
    trial.set_user_attr("metrics", trial_summary(full))
    trial.set_user_attr("dev_items", n)
    record_answers(trial, full)
    trial.set_user_attr("rung", "variants")
    return strategy.values(full)[0]


SCAN_PARAMS = "scan_params"  # study user attr: the scan's prompts' parameters, in the order they become trials


def enqueue_next_scanned(study) -> None:
    """Queue the scan's next prompt no trial has had yet (study/scan.py: the scan is the search's first phase).
    One at a time, when nothing else waits: a retry that `recover` queued for a trial cut short then runs before
    the scan's next prompt, in the order of the uninterrupted run."""
    tried = [t.system_attrs.get("fixed_params", t.params) for t in study.get_trials(deepcopy=False)]
    point = next((p for p in study.user_attrs.get(SCAN_PARAMS) or [] if p not in tried), None)
    if point is not None:
        study.enqueue_trial(point, user_attrs={"scanned": True})


def optimize(
    ctx: SearchContext, study, cached: CachingScorer, progress, worker: str, note=None, deadline: float | None = None
) -> None:
    """Run trials until the budget of finished (COMPLETE/PRUNED) trials is met, or, past `deadline` (a
    `time.monotonic()` value: the run's --budget), until the trials started before it have finished. The incumbent's
    trial is not one of the budget's.

    Before each trial, abandoned trials are failed and their parameters queued (`recover`); queued retries
    run first, even when the budget is met, so no started trial is lost. No new trial starts while the
    trials running elsewhere would meet the budget by themselves: this process waits for them to finish or
    to go stale (at most the grace period after their process died), then re-runs the stale ones.
    A sample that decodes to a prompt already evaluated is skipped and not counted (`DuplicatePrompt`);
    after MAX_DUPLICATES_IN_A_ROW in a row the space is taken as exhausted and the search stops short."""
    study_config = ctx.config.study
    budget = study_config.trials
    objective = make_objective(ctx, cached, worker)
    callbacks = [progress] if progress else None
    waiting_since = None
    duplicates_in_a_row = 0
    while True:
        recover(study, study_config.grace_period)
        done, running, waiting = counts(study)
        if not waiting and done >= budget:
            return
        if not waiting and deadline is not None and time.monotonic() >= deadline:
            if note is not None:
                note(f"time budget spent: stopped with {done} of {budget} trials finished")
            return
        if not waiting and done + running >= budget:
            if waiting_since is None and note is not None:
                note(
                    f"waiting for {running} trial(s) running elsewhere to finish, or to go stale "
                    f"(at most {study_config.grace_period}s after their process died) and be re-run here"
                )
            waiting_since = waiting_since or time.monotonic()
            time.sleep(min(2.0, study_config.heartbeat_interval))
            continue
        waiting_since = None
        objective.current = None
        if not waiting and study_config.scan != "off":  # a study scanned earlier, resumed with --scan off: no queue
            enqueue_next_scanned(study)
        try:
            study.optimize(objective, n_trials=1, callbacks=callbacks, gc_after_trial=False, catch=(DuplicatePrompt,))
        except BaseException as exc:
            if not isinstance(exc, PromptTooLongError):  # a prompt too long would fail again
                give_back(study, objective.current)
            raise
        last = study._storage.get_trial(objective.current) if objective.current is not None else None
        duplicates_in_a_row = duplicates_in_a_row + 1 if last is not None and is_duplicate(last) else 0
        if duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
            if note is not None:
                note(
                    f"stopped with {done} of {budget} trials: the last {duplicates_in_a_row} samples all decoded to prompts "
                    "already evaluated, so the space holds few other prompts the sampler finds"
                )
            return
