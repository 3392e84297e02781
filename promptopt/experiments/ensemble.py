"""Prompt ensembles: K members (prompt + decision rule each) chosen on dev by greedy forward selection
(Caruana et al. 2004), answering with the argmax of the mean of the members' label-normalized decision
scores (promptopt.decision.ensemble_scores). Test items never choose: selection reads dev tables only.

Greedy forward selection without replacement: start from the candidate with the best dev objective, then add,
one at a time, the candidate that gives the ensemble the best dev objective (ties: the earlier candidate in the
given order, i.e. the better single prompt), until K members. The objective is dev accuracy, or the robust
objective (an item counts when it is right clean and under every variant of the search suite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from promptopt.decision import ensemble_scores

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


def combined_decisions(tables: Sequence[pd.DataFrame], keys: Sequence[str] = ("item_id",)) -> pd.DataFrame:
    """The ensemble's answers on rows the member tables share (joined on `keys`): `pred` and, where the tables
    carry gold, `correct`. Rows a member lacks are left out."""
    merged = None
    for k, table in enumerate(tables):
        part = table[[*keys, "decision_scores", *(["gold"] if "gold" in table and k == 0 else [])]].rename(
            columns={"decision_scores": f"scores_{k}"}
        )
        merged = part if merged is None else merged.merge(part, on=list(keys), how="inner")
    scores = [
        ensemble_scores([list(row[f"scores_{k}"]) for k in range(len(tables))])
        for _, row in merged.iterrows()
    ]
    out = merged[list(keys) + (["gold"] if "gold" in merged else [])].copy()
    out["decision_scores"] = scores
    out["pred"] = [int(np.argmax(s)) for s in scores]
    if "gold" in out:
        out["correct"] = out["pred"].to_numpy() == out["gold"].to_numpy()
    return out.reset_index(drop=True)


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


def greedy_select(candidates: Sequence[Member], k: int, objective: str = "accuracy") -> tuple[list[Member], list[float]]:
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


__all__ = ["Member", "OBJECTIVES", "combined_decisions", "greedy_select", "objective_of"]
