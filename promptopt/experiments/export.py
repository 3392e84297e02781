"""`promptopt export`: pick the winner (or a named trial) of a search or compare run and write a card
version 2 — everything its score depends on (promptopt/card_schema.json) — or a derived form: chat
messages, a plain text template, or an lm-evaluation-harness task.

The model is loaded (one session, the run's own result cache, so the winner's scores are not recomputed)
because fingerprints and the token-id hash need its tokenizer. Everything is checked before anything is
written, and each file is written atomically: a failed export leaves nothing behind.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from promptopt.card import prompt_hashes, sha256_json, sha256_text, token_ids_sha256, validate_card
from promptopt.errors import UserError
from promptopt.experiments.session import Session
from promptopt.prompts import Prompt
from promptopt.yamlio import check_output

FORMATS = ("card", "messages", "text", "lm-eval")
_BOOTSTRAP = 2000


# --- which run, which trial --------------------------------------------------------------------------
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


SELECTIONS = ("dev", "robust")
_CANDIDATE_COLUMNS = {"strategy", "seed", "rank", "winner", "trial", "dev_accuracy"}


def compare_candidates(root: Path):
    """Every prompt a compare evaluated for a searched strategy (compare_runs.csv: each search's top-N, with its
    dev accuracy), in the compare's order. Selection reads the dev columns only."""
    import pandas as pd

    path = root / "compare_runs.csv"
    if not path.is_file():
        raise UserError(f"{root}: compare_runs.csv missing: the compare did not finish (rerun it with --resume)")
    runs = pd.read_csv(path)
    missing = _CANDIDATE_COLUMNS - set(runs.columns)
    if missing:
        raise UserError(
            f"{path}: written by an older promptopt (no {', '.join(sorted(missing))} column): rerun the compare"
        )
    searched = runs[runs["strategy"] != "baseline"].reset_index(drop=True)
    if searched.empty:
        raise UserError(f"{path}: no searched strategy in the comparison")
    return searched.assign(order=range(len(searched)))


def select_by_dev(candidates, strategy: str | None = None):
    """Among the searches' own winners (of `strategy`, else of every strategy), the highest dev accuracy; ties go
    to the strategy compared first, then the lower seed. -> (row, how). Test numbers are never read."""
    winners = candidates[candidates["winner"].astype(bool)]
    if strategy is not None:
        winners = winners[winners["strategy"] == strategy]
    best = winners.sort_values(["dev_accuracy", "order"], ascending=[False, True], kind="stable").iloc[0]
    among = f"the {len(winners)} {strategy + ' ' if strategy else ''}search winners"
    return best, (
        f"highest dev accuracy ({best['dev_accuracy']:.3f}) among {among} (ties: the strategy compared first, "
        "then the lower seed); no test number was read"
    )


def _strategy_rows(candidates, strategy: str | None, root: Path):
    if strategy is None:
        return candidates
    if strategy not in set(candidates["strategy"]):
        raise UserError(f"--strategy {strategy}: {root} compares {', '.join(dict.fromkeys(candidates['strategy']))}")
    return candidates[candidates["strategy"] == strategy]


def open_run(run_dir: str | Path, *, strategy: str | None = None, pick: dict | None = None) -> Run:
    """A search run directory, or one search of a compare directory: `pick` (a compare_runs.csv row chosen by
    `select_robust`), else the dev-accuracy winner (`select_by_dev`) of `strategy` or of every strategy.
    Errors name the directory and what is missing."""
    from promptopt.search import SearchConfig

    root = Path(run_dir)
    winner_trial, selection = None, ""
    if not root.is_dir():
        raise UserError(f"{root}: no such run directory")
    compare_row = None
    if (root / "compare.csv").is_file():
        candidates = _strategy_rows(compare_candidates(root), strategy, root)
        if pick is None:
            pick, selection = select_by_dev(candidates)
            pick = _plain_row(pick)
        else:
            selection = pick.pop("selection", "")
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
        config = SearchConfig.from_dict(json.loads((path / "config.json").read_text(encoding="utf-8")))
    except (ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{path / 'config.json'}: unreadable run settings ({exc})") from None
    config = config.moved_to(path, root)
    if strategy is not None and compare_row is None and config.study.strategy != strategy:
        raise UserError(f"--strategy {strategy}: {path} is a {config.study.strategy} run")
    if not (path / "summary.json").is_file():
        raise UserError(
            f"{path}: no finished study (summary.json missing): finish it with `promptopt search ... --resume`"
        )
    summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    return Run(
        path=path,
        config=config,
        summary=summary,
        cache_dir=cache_dir,
        compare_row=compare_row,
        winner_trial=winner_trial,
        selection=selection or summary.get("selection", ""),
    )


def _plain_row(row) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.to_dict().items()}


def load_study(run: Run):
    """The run's Optuna study, read from its storage (a missing SQLite file is an error, never created)."""
    from promptopt.search.storage import read_study

    return read_study(run.config, where=str(run.path))


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
    from promptopt.search import decode_params

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
    from promptopt.search.space import load_space

    name = str(params.get("instruction"))
    proposed = load_space(config.study.space or data.spec.name).proposals.get(name)
    return _clean({"name": name, **proposed}) if proposed else None


# --- metrics -------------------------------------------------------------------------------------------
def _clean(value):
    """JSON/YAML-safe: numpy scalars to Python, NaN and infinities to None."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def bootstrap_mean_ci(values, *, seed: int = 0, resamples: int = _BOOTSTRAP) -> list:
    """Percentile bootstrap 95% interval of the mean of the finite values (None where there are none)."""
    import numpy as np

    from promptopt.metrics.stats import bootstrap_interval

    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data)]
    if len(data) == 0:
        return [None, None]
    return list(bootstrap_interval(lambda idx: data[idx].mean(), len(data), n_boot=resamples, seed=seed))


def measured(table) -> dict:
    """A split's summary for the card: accuracy with its Wilson interval, δ_TCB and PPL with bootstrap
    intervals, and the per-item correctness string."""
    from promptopt.scoring import summarize

    s = summarize(table)
    out = {"n": s["n"], "accuracy": s["accuracy"], "accuracy_ci95": s["accuracy_ci95"]}
    if "tcb" in table:
        out.update(
            tcb_mean=s.get("tcb_mean"), tcb_mean_ci95=bootstrap_mean_ci(table["tcb"]), tcb_geomean=s.get("tcb_geomean")
        )
    out.update(ppl_mean=s["ppl_mean"], ppl_mean_ci95=bootstrap_mean_ci(table["ppl"]))
    out["correct"] = "".join("1" if bool(c) else "0" for c in table["correct"])
    return _clean(out)


def _robustness(row: dict | None, families: dict | None = None) -> dict | None:
    """The compare's robustness numbers of a winner, over all judged families and split seen/unseen (`families`:
    the compare summary's families_seen / families_unseen lists)."""
    measured = ("pdr", "acc_worst", "taboo_retention_i1")
    if not row or all(row.get(k) is None or (isinstance(row.get(k), float) and math.isnan(row[k])) for k in measured):
        return None  # compared without a suite: the columns exist but hold nothing
    keys = ("pdr", "acc_worst", "acc_worst_family", "acc_var_pert", "taboo_retention_i1")
    out = {"n": None, **{k: row.get(k) for k in keys}}
    for key in ("pdr", "acc_worst"):  # intervals, where compare recorded them
        if row.get(f"{key}_ci_low") is not None and row.get(f"{key}_ci_high") is not None:
            out[f"{key}_ci95"] = [row[f"{key}_ci_low"], row[f"{key}_ci_high"]]
    for split in ("unseen", "seen"):  # the same over the families no search saw, and the ones it saw
        for key in ("pdr", "acc_worst"):
            name = f"{key}_{split}"
            if name in row:
                out[name] = row[name]
                if row.get(f"{name}_ci_low") is not None and row.get(f"{name}_ci_high") is not None:
                    out[f"{name}_ci95"] = [row[f"{name}_ci_low"], row[f"{name}_ci_high"]]
        if f"acc_worst_family_{split}" in row:
            out[f"acc_worst_family_{split}"] = row[f"acc_worst_family_{split}"]
    if families:
        out.update({f"families_{split}": families.get(f"families_{split}") for split in ("unseen", "seen")})
    return _clean(out)


# --- the card ------------------------------------------------------------------------------------------
def render_check(prompt: Prompt, item, tokenizer) -> tuple[str, list[int]]:
    """The text the scorer renders for an item and its token ids, encoded as the scorer encodes it."""
    text = prompt.context(item.question, item.choices, tokenizer)
    return text, list(tokenizer(text, add_special_tokens=prompt.add_special_tokens)["input_ids"])


def rendering_section(prompt: Prompt, tokenizer) -> dict:
    """How the prompt becomes text: plain or chat, with the chat template and what it saw (chat cards)."""
    from promptopt.experiments.fingerprint import chat_template_sha256

    section = {
        "mode": "chat" if prompt.template.chat else "plain",
        "add_special_tokens": prompt.add_special_tokens,
        "chat_template": None,
        "chat_template_sha256": chat_template_sha256(tokenizer),
    }
    if prompt.template.chat:
        section["chat_template"] = tokenizer.chat_template
        section["template_vars"] = {
            k: (list(v) if isinstance(v, (list, tuple)) else str(v)) for k, v in tokenizer.special_tokens_map.items()
        }
    return section


def answer_section(spec, items) -> dict:
    """How answers are read: the task's answer type, metric, and its fixed choices if every item shares them."""
    choice_sets = {tuple(i.choices) for i in items if i.choices is not None}
    fixed = (
        list(next(iter(choice_sets))) if len(choice_sets) == 1 and all(i.choices is not None for i in items) else None
    )
    return {"type": spec.answer_type, "metric": spec.metric, "gold_format": spec.gold_format, "choices": fixed}


def build_card(
    session: Session,
    prompt: Prompt,
    *,
    dev_items: list,
    test_items: list,
    search: dict | None = None,
    robustness: dict | None = None,
    carving: dict | None = None,
) -> dict:
    """A validated card version 2 for `prompt`, measured on `dev_items` and `test_items` with the session's
    (caching) scorer. The light loader must reproduce the scored text byte for byte, or nothing is built."""
    from promptopt.experiments.fingerprint import (
        data_sha256,
        items_sha256,
        model_fingerprint,
        task_sha256,
        tokenizer_sha256,
        versions,
    )
    from promptopt.production import card_prompt

    if not test_items:
        raise UserError(f"task {prompt.task}: no test items to measure the card on")
    scorer, data, spec = session.scorer, session.data, session.data.spec
    lm = scorer.lm
    table = scorer.score_table if hasattr(scorer, "score_table") else (lambda p, items: scorer.score(p, items).table)
    metrics = {"test": measured(table(prompt, test_items))}
    if dev_items:
        metrics = {"dev": measured(table(prompt, dev_items)), **metrics}
    metrics["robustness"] = robustness
    first = test_items[0]
    text, ids = render_check(prompt, first, lm.tokenizer)
    base = prompt.to_card()
    card = {
        "promptopt_card": 2,
        **{k: base[k] for k in ("task", "instruction", "template", "exemplars")},
        "rendering": rendering_section(prompt, lm.tokenizer),
        "answer": answer_section(spec, [*test_items, *dev_items]),
        "generation": (
            {"max_new_tokens": spec.max_new_tokens, "stop": list(spec.stop), "do_sample": False}
            if spec.generative
            else None
        ),
        "model": {
            "spec": session.model_config.spec,
            **model_fingerprint(session.model_config.spec),
            "tokenizer_sha256": tokenizer_sha256(lm.tokenizer),
            "dtype": str(lm.model.dtype).removeprefix("torch."),
            "device": lm.device.type,
            "context_length": lm.context_length,
        },
        "data": {
            "task": session.data_config.task,
            "task_sha256": task_sha256(spec),
            "data_sha256": data_sha256(spec, session.data_config.subsets),
            "items_sha256": items_sha256(data),
            "subsets": list(session.data_config.subsets) if session.data_config.subsets else None,
            "split_seed": spec.seed,
            "carving_sha256": sha256_json(carving) if carving else None,
            "dev_ids": [i.id for i in dev_items],
            "test_ids": [i.id for i in test_items],
        },
        "search": search,
        "metrics": metrics,
        "versions": versions(),
        "check": {
            "item_id": first.id,
            "text_sha256": sha256_text(text),
            "token_ids_sha256": token_ids_sha256(ids),
            "n_tokens": len(ids),
            "prompt_sha256": prompt_hashes(base),
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    card = _clean(card)
    validate_card(card, "exported card")
    light = card_prompt(card, "exported card").render(first.question, first.choices)
    if light != text:
        raise UserError(
            f"task {prompt.task}: the card's prompt renders differently without the tokenizer than the scorer "
            "rendered it (its chat template uses something promptopt.load_prompt does not reproduce); not exported"
        )
    return card


# --- robust selection after the fact -------------------------------------------------------------------------
def select_robust(root: Path, candidates, *, device: str | None = None, suite: str = "cheap", limit: int | None = None):
    """Among every prompt the compare evaluated (each search's top-N) whose dev accuracy is inside the best one's
    95% Wilson interval, the best dev Acc_worst under `suite` (default: the families the `robust` strategy sees;
    measured now on dev items, through the compare's result cache). -> (compare_runs row with "selection", session)."""
    from promptopt.metrics.stats import wilson_interval
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite

    the_suite = load_suite(suite)
    rows = [_plain_row(r) for _, r in candidates.iterrows()]
    first = open_run(root, pick=dict(rows[0]))
    config = first.config if device is None else first.config.replace(device=device)
    session = Session(model=config.model, data=config.data, out=root, batch_size=config.batch_size)
    n = int(first.summary["dev"]["n"])
    best = max(rows, key=lambda r: (r["dev_accuracy"], -r["order"]))
    low, _ = wilson_interval(round(best["dev_accuracy"] * n), n)
    eligible = [r for r in rows if r["dev_accuracy"] >= low]
    dev, similarity, scored, seen = session.items("dev", limit), Similarity(), [], {}
    for row in eligible:
        run = open_run(root, pick=dict(row))
        prompt = decode_trial(run, session.data, pick_trial(run, load_study(run), None).params)
        key = json.dumps(prompt.to_card(), sort_keys=True)
        if key not in seen:  # a prompt two searches share is stressed once
            seen[key] = evaluate_robustness(
                session.scorer,
                prompt,
                dev,
                the_suite,
                pool=session.data.pool,
                similarity=similarity,
                paraphrases=session.paraphrases,
            ).summary["acc_worst"]
        scored.append((seen[key], row["dev_accuracy"], -row["order"], row))
    acc_worst, _, _, chosen = max(scored, key=lambda x: x[:3])
    chosen["selection"] = (
        f"best dev Acc_worst ({acc_worst:.3f}, suite {the_suite.name}, {len(dev)} dev items) among {len(eligible)} "
        f"of {len(rows)} evaluated candidates whose dev accuracy is inside the best one's 95% interval "
        f"(≥ {low:.3f}); no test number was read"
    )
    return chosen, session


# --- the command -----------------------------------------------------------------------------------------
@dataclass
class Exported:
    card: dict
    paths: list[Path]
    run: Run
    trial: int
    warnings: list[str]


def export_run(
    run_dir: str | Path,
    *,
    out: str | Path,
    strategy: str | None = None,
    trial: int | None = None,
    fmt: str = "card",
    device: str | None = None,
    select: str = "dev",
) -> Exported:
    """Pick a trial of a finished run by dev numbers only (`select`: dev accuracy, or robust: dev Acc_worst among the
    trials as accurate as the best), build its card (measured on the run's dev and test items: the test numbers
    stay a held-out estimate) and write `out` in format `fmt` (card, messages, text or lm-eval)."""
    from promptopt.experiments import formats

    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if select not in SELECTIONS:
        raise UserError(f"--select {select}: expected one of {', '.join(SELECTIONS)}")
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file name")
    check_output(out, folder=False, what="--out")  # before the card is measured
    root, session = Path(run_dir), None
    if (
        root / "rounds.json"
    ).is_file():  # search --rounds: the last round's winner (each round starts from the previous best)
        last = json.loads((root / "rounds.json").read_text(encoding="utf-8"))["rounds"][-1]["round"]
        root = root / f"round{last}"
    if select == "robust":
        if not (root / "compare.csv").is_file():
            raise UserError(
                f"--select robust: {root} is not a compare directory (a search run has one winner; pass --trial to pick another)"
            )
        if trial is not None:
            raise UserError("--select robust chooses the trial itself; drop --trial")
        pick, session = select_robust(root, _strategy_rows(compare_candidates(root), strategy, root), device=device)
        run = open_run(root, pick=pick)
    else:
        run = open_run(root, strategy=strategy)
    study = load_study(run)
    chosen = pick_trial(run, study, trial)
    config = run.config if device is None else run.config.replace(device=device)
    session = session or Session(model=config.model, data=config.data, out=run.cache_dir, batch_size=config.batch_size)
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
        "params": _clean(dict(chosen.params)),
    }
    proposed = instruction_provenance(config, session.data, chosen.params)
    if proposed:
        search["instruction_provenance"] = proposed
    carving = (
        json.loads((run.path / "splits.json").read_text(encoding="utf-8"))
        if (run.path / "splits.json").is_file()
        else None
    )
    card = build_card(
        session,
        prompt,
        dev_items=session.items("dev"),
        test_items=session.items("test"),
        search=search,
        robustness=_robustness(run.compare_row, _compare_families(run)) if winner else None,
        carving=carving,
    )
    paths = formats.write(card, fmt, out, items=session.items("test"))
    return Exported(
        card=card, paths=paths, run=run, trial=chosen.number, warnings=_warnings(session, card, run, prompt)
    )


def _compare_families(run: Run) -> dict | None:
    """families_seen / families_unseen of the compare a run belongs to (its summary.json), if any."""
    path = run.cache_dir / "summary.json"
    if run.compare_row is None or not path.is_file():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    return {key: summary.get(key) for key in ("families_seen", "families_unseen")}


MIN_CLEAN_CORRECT = 20  # fewer clean-correct items than this and a PDR is mostly noise


def _warnings(session: Session, card: dict, run: Run, prompt: Prompt) -> list[str]:
    """What a user should know before trusting the card (read, never used to choose): it is no better than the
    task's default prompt on the same test items, or its PDR rests on few clean-correct items."""
    test_items = session.items("test")
    table = session.scorer.score(session.data.default_prompt(), test_items).table
    default, ours = float(table["correct"].mean()), card["metrics"]["test"]["accuracy"]
    out = []
    if ours <= default:
        out.append(
            f"the exported prompt is not better than the task's default prompt on the same {len(test_items)} test "
            f"items ({ours:.3f} vs {default:.3f})"
        )
    robust = card["metrics"].get("robustness")
    n_robust = (
        json.loads((run.cache_dir / "summary.json").read_text()).get("n_robust")
        if (run.cache_dir / "summary.json").is_file()
        else None
    )
    if robust and robust.get("pdr") is not None and n_robust:
        clean_correct = int(session.scorer.score(prompt, test_items[:n_robust]).table["correct"].sum())
        if clean_correct < MIN_CLEAN_CORRECT:
            out.append(
                f"its PDR ({robust['pdr']:.3f}) rests on {clean_correct} clean-correct items (fewer than {MIN_CLEAN_CORRECT}): "
                "read it with its interval"
            )
    return out


__all__ = [
    "FORMATS",
    "SELECTIONS",
    "Exported",
    "Run",
    "build_card",
    "compare_candidates",
    "export_run",
    "open_run",
    "pick_trial",
    "select_by_dev",
    "select_robust",
]
