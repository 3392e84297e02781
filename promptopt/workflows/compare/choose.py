"""Which of a search's top trials wins: the strategy's own choice, or (`select="robust"`) the selection rule
(metrics/stats/selection.py) over the top-N with tie-break `robust`: among the trials not significantly worse than
the most accurate on the same dev items (paired), the best dev Acc_worst under the search suite, measured for the
tied trials only. Dev items only: the test items stay held out."""

from __future__ import annotations

WINNER_SELECTIONS = ("strategy", "robust")  # compare --select: how each search's winner is chosen among its top-N


def choose_winner(select, ranked, result, evaluator, dev):
    """(the winning entry of `ranked`, how it was chosen): `evaluator.robustness` measures each tied trial."""
    if select == "strategy" or len(ranked) == 1:
        return ranked[0], result.selection
    from dataclasses import replace

    from promptopt.metrics.stats.selection import choose
    from promptopt.study.strategies import candidate_of

    under = getattr(evaluator, "search_suite_name", None)

    def measure(tied):  # robustness measured on dev items: the test items stay held out
        by_number = {e["number"]: e for e in ranked}
        out = []
        for c in tied:
            summary, _, _ = evaluator.robustness(by_number[c.key]["prompt"], dev[: evaluator.robust_limit])
            out.append(replace(c, robust=float(summary["acc_worst"])))
        return out

    selection = choose([candidate_of(e) for e in ranked], tie_break="robust", fill=measure)
    chosen = next(e for e in ranked if e["number"] == selection.winner.key)
    suite = f" (search suite {under})" if under else ""
    return chosen, f"--select robust among the top {len(ranked)} trials{suite}: {selection.describe()}"
