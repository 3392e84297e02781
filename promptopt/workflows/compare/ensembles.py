"""A compare's ensembles: per search, K members chosen on dev by greedy forward selection among its distinct
finished trials (workflows/ensemble.py), each member evaluated like any candidate (test answers and stress,
decided by its own rule), the ensemble's answers combined from theirs and measured like a winner's."""

from __future__ import annotations

import math

from promptopt.scoring.ensemble import ensemble_test
from promptopt.workflows.compare.evaluate import Evaluated
from promptopt.workflows.compare.tables import run_record
from promptopt.workflows.ensemble import Member, ensemble_candidates, ensemble_items, greedy_select

MAX_CANDIDATES = 16  # the search's best distinct trials (in its strategy's order) that may become members


def _members(result, evaluator, dev, objective: str) -> list[Member]:
    """The search's best distinct trials in its strategy's order, as ensemble candidates (workflows/ensemble.py)."""

    def variants(prompt, scorer):  # every candidate stressed on dev items under the search suite
        *_, items = evaluator._stress(prompt, dev[: evaluator.robust_limit], evaluator.search_suite, scorer=scorer)
        stressed = items[items["family"].notna()]
        return stressed.rename(columns={"perturbed_scores": "decision_scores"})[
            ["item_id", "family", "variant", "decision_scores"]
        ]

    return ensemble_candidates(
        ((entry["prompt"], {"trial": entry["number"]}) for entry in result.ranking),
        evaluator.session.scorer,
        dev,
        limit=MAX_CANDIDATES,
        variants=variants if objective == "robust" else None,
    )


def build_ensembles(result, sizes, evaluator, dev, *, objective: str, seed: int, entry: str) -> dict:
    """{K: (the ensemble's Evaluated, its compare_runs row)} for every K of `sizes` that the search's trials can
    fill. Greedy selection for the largest K gives the smaller ones as its prefixes (the same first steps)."""
    from promptopt.robustness.suite.from_items import robustness_from_items
    from promptopt.workflows.compare.evaluate import _DECIDED_COLUMNS, _TEST_COLUMNS

    candidates = _members(result, evaluator, dev, objective)
    sizes = sorted(k for k in sizes if k <= len(candidates))
    if not sizes:
        return {}
    chosen, trace = greedy_select(candidates, max(sizes), objective)
    out = {}
    for k in sizes:
        members = chosen[:k]
        evaluations = [evaluator(m.prompt) for m in members]
        test = ensemble_test([ev.test for ev in evaluations])
        evaluated = Evaluated(test[[c for c in _TEST_COLUMNS + _DECIDED_COLUMNS if c in test]])
        if evaluator.suite is not None:
            items = ensemble_items([ev.items for ev in evaluations])
            evaluated.items = items
            evaluated.robust = robustness_from_items(items, evaluator.suite, evaluator.seen)
            evaluated.robust["taboo_retention_i1"] = math.nan
            clean = items[items["family"].isna()]
            evaluated.clean = clean.set_index("item_id")["clean_correct"].astype(bool).rename("correct")
            variants = items[items["family"].notna()]
            evaluated.variants = variants.assign(correct=variants["perturbed_correct"].astype(bool))[
                ["item_id", "family", "correct", "seen"]
            ]
            evaluated.variants["seen"] = evaluated.variants["seen"].astype(bool)
        trials = [m.source["trial"] for m in members]
        how = (
            f"greedy forward selection of {k} members on dev ({objective} {trace[k - 1]:.3f}) among the "
            f"{len(candidates)} best distinct trials of the {entry} search: trials {trials}"
        )
        row = run_record(
            f"{entry}+ens{k}",
            seed,
            0,
            evaluated,
            winner=True,
            how=how,
            trial=trials[0],
            dev_accuracy=trace[k - 1],
            card="",
            members=trials,
        )
        out[k] = (evaluated, row)
    return out


__all__ = ["MAX_CANDIDATES", "build_ensembles"]
