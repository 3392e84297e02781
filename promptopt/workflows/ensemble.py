"""Prompt ensembles: K members (prompt + decision rule each) chosen on dev by greedy forward selection
(Caruana et al. 2004), answering with the argmax of the mean of the members' label-normalized decision
scores (promptopt.decision.ensemble_scores). Test items never choose: selection reads dev tables only.

Greedy forward selection without replacement: start from the candidate with the best dev objective, then add,
one at a time, the candidate that gives the ensemble the best dev objective (ties: the earlier candidate in the
given order, i.e. the better single prompt), until K members. The objective is dev accuracy, or the robust
objective (an item counts when it is right clean and under every variant of the search suite).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from promptopt.decision import ensemble_scores
from promptopt.scoring.ensemble import combined_decisions

OBJECTIVES = ("accuracy", "robust")


@dataclass
class Member:
    """A candidate member: its prompt (with its decision rule's name), the fitted rule, and where it came from."""

    prompt: object  # promptopt.prompts.Prompt
    rule: object  # promptopt.decision.DecisionRule, fitted on dev
    source: dict  # strategy, seed, study, trial
    dev: pd.DataFrame  # decided dev table: item_id, gold, correct, decision_scores
    dev_variants: pd.DataFrame | None = None  # decided dev variants: item_id, family, variant, decision_scores
    extra: dict = field(default_factory=dict)


DEV_COLUMNS = [
    "item_id",
    "gold",
    "correct",
    "decision_scores",
]  # a member's decided dev answers, as selection reads them


def ensemble_candidates(
    prompts: Iterable[tuple[object, dict]],
    scorer,
    dev: list,
    *,
    limit: int,
    variants: Callable | None = None,
) -> list[Member]:
    """The candidates an ensemble is chosen from, built in this one place for `compare --ensembles` and `export
    --ensemble`: the first `limit` of `prompts` ((prompt, source) pairs, distinct and in the caller's order of
    preference), each with its decision rule fit on the `dev` items and its dev answers decided by that rule
    (as its card would answer). `variants(prompt, deciding_scorer)`: its decided answers to the dev variants
    (compare's robust objective)."""
    from itertools import islice

    from promptopt.scoring.calibration import deciding_scorer

    out = []
    for prompt, source in islice(prompts, limit):
        deciding, rule = deciding_scorer(scorer, prompt, dev)
        member = Member(prompt=prompt, rule=rule, source=source, dev=deciding.score(prompt, dev).table[DEV_COLUMNS])
        if variants is not None:
            member.dev_variants = variants(prompt, deciding)
        out.append(member)
    return out


def accuracy_objective(members: Sequence[Member]) -> float:
    return float(combined_decisions([m.dev for m in members])["correct"].mean())


def robust_objective(members: Sequence[Member]) -> float:
    """Share of dev items right clean and under every search-suite variant, all decided by the ensemble."""
    clean = combined_decisions([m.dev for m in members]).set_index("item_id")["correct"].astype(bool)
    ok = clean.copy()
    if all(m.dev_variants is not None and len(m.dev_variants) for m in members):
        variants = combined_decisions(
            [m.dev_variants.merge(m.dev[["item_id", "gold"]], on="item_id") for m in members],
            keys=("item_id", "family", "variant"),
        )
        failed = variants.loc[~variants["correct"].astype(bool), "item_id"].unique()
        ok.loc[ok.index.isin(failed)] = False
    return float(ok.mean())


def objective_of(name: str) -> Callable[[Sequence[Member]], float]:
    if name not in OBJECTIVES:
        from promptopt.errors import ConfigError

        raise ConfigError(f"ensemble objective: expected one of {', '.join(OBJECTIVES)}, got {name!r}")
    return accuracy_objective if name == "accuracy" else robust_objective


def greedy_select(
    candidates: Sequence[Member], k: int, objective: str = "accuracy"
) -> tuple[list[Member], list[float]]:
    """K members by greedy forward selection on dev (module docstring), and the dev objective after each step."""
    if k < 1:
        raise ValueError("an ensemble needs at least one member")
    if len(candidates) < k:
        from promptopt.errors import UserError

        raise UserError(f"--ensemble {k}: only {len(candidates)} distinct candidate prompts to choose from")
    score = objective_of(objective)
    chosen: list[Member] = []
    trace: list[float] = []
    rest = list(candidates)
    while len(chosen) < k:
        values = [score(chosen + [c]) for c in rest]
        best = int(np.argmax(values))  # the first of equals: the better single prompt comes first in `rest`
        chosen.append(rest.pop(best))
        trace.append(values[best])
    return chosen, trace


__all__ = [
    "DEV_COLUMNS",
    "OBJECTIVES",
    "Member",
    "combined_decisions",
    "ensemble_candidates",
    "greedy_select",
    "objective_of",
]


# --- an ensemble's answers from its members' ---------------------------------------------------------------------
def _decide(member_scores: list) -> int:
    return int(np.argmax(ensemble_scores([list(s) for s in member_scores])))


def _variant_key(row) -> tuple:
    """Which perturbation a row is: a changed question is the same text under every member (variants are seeded
    per item, family and index); a prompt-level one (exemplars, format) is its index, applied to each member."""
    if row.family is None or (isinstance(row.family, float) and np.isnan(row.family)):
        return (row.item_id, None, "clean", None)
    if row.variant_kind == "question":
        return (row.item_id, row.family, "question", row.variant_text)
    return (row.item_id, row.family, "prompt", int(row.variant))


def ensemble_items(member_items: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The ensemble's answers under perturbation (ITEM_COLUMNS) from its members' robustness answers: every
    perturbation any member was given, each member answering it with its perturbed scores where it was
    perturbed and with its clean scores where the family left it as it was (e.g. replacing the shots of a
    0-shot member). δ_TCB and its companions are the minimum over members."""
    clean_scores, clean_tcb, by_key, meta = [], [], [], {}
    for items in member_items:
        clean = items[items["family"].isna()].set_index("item_id")
        clean_scores.append(clean["clean_scores"])
        clean_tcb.append(clean["clean_tcb"])
        keyed = {}
        for row in items[items["family"].notna()].itertuples(index=False):
            key = _variant_key(row)
            keyed[key] = (row.perturbed_scores, row.perturbed_tcb)
            meta.setdefault(key, row)
        by_key.append(keyed)
    gold = member_items[0][member_items[0]["family"].isna()].set_index("item_id")["gold"]
    rows = []
    for item_id in gold.index:
        scores = [c[item_id] for c in clean_scores]
        pred = _decide(scores)
        rows.append(
            {
                "item_id": item_id,
                "family": None,
                "clean_correct": pred == int(gold[item_id]),
                "clean_prediction": str(pred),
                "clean_tcb": float(min(t[item_id] for t in clean_tcb)),
                "gold": int(gold[item_id]),
                "clean_scores": ensemble_scores([list(s) for s in scores]),
                "variant_kind": "clean",
            }
        )
    clean_by_item = {r["item_id"]: r for r in rows}
    for key, first in meta.items():
        item_id = key[0]
        scores, tcbs = [], []
        for k, keyed in enumerate(by_key):
            s, t = keyed.get(key, (clean_scores[k][item_id], clean_tcb[k][item_id]))
            scores.append(s)
            tcbs.append(t)
        pred = _decide(scores)
        base = clean_by_item[item_id]
        rows.append(
            {
                "item_id": item_id,
                "family": first.family,
                "operator": first.operator,
                "variant_kind": first.variant_kind,
                "variant_text": first.variant_text,
                "clean_correct": base["clean_correct"],
                "perturbed_correct": pred == base["gold"],
                "clean_prediction": base["clean_prediction"],
                "perturbed_prediction": str(pred),
                "clean_tcb": base["clean_tcb"],
                "perturbed_tcb": float(np.nanmin(np.asarray(tcbs, dtype=float))),
                "gold": base["gold"],
                "clean_scores": base["clean_scores"],
                "perturbed_scores": ensemble_scores([list(s) for s in scores]),
                "seen": first.seen,
            }
        )
    table = pd.DataFrame(rows)
    variant_rows = table["family"].notna()
    numbered = table[variant_rows].groupby(["family", "item_id"], sort=False).cumcount().to_numpy()
    index = [k[3] if k[2] == "prompt" else None for k in meta]  # a prompt-level variant keeps its index (format i)
    table.loc[variant_rows, "variant"] = [i if i is not None else n for i, n in zip(index, numbered)]
    from promptopt.robustness.suite import ITEM_COLUMNS

    table = table.reindex(columns=ITEM_COLUMNS)
    table["variant"] = table["variant"].astype("Int64")
    table["perturbed_correct"] = table["perturbed_correct"].astype("boolean")
    return table
