"""Which of a search's top trials wins: the strategy's own choice, or (`select="robust"`) the best dev Acc_worst
under the search suite among the trials whose dev accuracy is inside the best one's 95% interval. Dev items
only: the test items stay held out."""

from __future__ import annotations

from promptopt.metrics.stats import wilson_interval

SELECTIONS = ("strategy", "robust")


def choose_winner(select, ranked, result, evaluator, dev):
    """(the winning entry of `ranked`, how it was chosen): `evaluator.robustness` measures each eligible trial."""
    if select == "strategy":
        return ranked[0], result.selection
    best = max(ranked, key=lambda e: (e["accuracy"], -e["number"]))
    low, _ = wilson_interval(round(best["accuracy"] * best["n"]), best["n"])
    eligible = [e for e in ranked if e["accuracy"] >= low]
    scored = []
    for entry in eligible:  # robustness measured on dev items: the test items stay held out
        summary, _, _ = evaluator.robustness(entry["prompt"], dev[: evaluator.robust_limit])
        scored.append((summary["acc_worst"], entry["accuracy"], -entry["number"], entry))
    acc_worst, _, _, chosen = max(scored, key=lambda x: x[:3])
    under = getattr(evaluator, "search_suite_name", None)
    return chosen, (
        f"best dev Acc_worst ({acc_worst:.3f}{f', search suite {under}' if under else ''}) among {len(eligible)} of the top {len(ranked)} trials whose dev "
        f"accuracy is inside the best one's 95% interval (≥ {low:.3f})"
    )
