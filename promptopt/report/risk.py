"""The report's risk–coverage section: if a server flags the answers a signal calls most fragile, how often do the
answers it keeps flip under an unseen perturbation, and how accurate are they (analyses/risk_coverage.py)."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

from promptopt.errors import UserError
from promptopt.report.families import usable
from promptopt.report.numbers import cell_estimate, esc, note, table, td, tr

_LABELS = {"tcb": "δ_TCB", "margin": "margin", "top_prob": "max probability", "entropy": "entropy"}


def risk_section(source, *, n_boot: int = 1000) -> str:
    from promptopt.analyses.risk_coverage import plot, risk_coverage

    if not usable(source.items):
        return note("No answers under perturbation here (robustness_items.parquet): nothing to flag.")
    try:
        frame = risk_coverage(source.items, n_boot=n_boot)
    except UserError as exc:
        return note(esc(str(exc)))
    rows = []
    for _, r in frame.iterrows():
        diff = r.get("flip_rate_minus_tcb")
        rows.append(
            tr(
                [
                    td(_LABELS.get(r.signal, r.signal), left=True),
                    td(f"{r.coverage:.0%}"),
                    td(str(r.n_kept)),
                    cell_estimate(r.flip_rate, r.flip_rate_ci_low, r.flip_rate_ci_high, col="flip_rate"),
                    cell_estimate(r.accuracy, r.accuracy_ci_low, r.accuracy_ci_high, col="accuracy"),
                    cell_estimate(
                        diff,
                        r.get("flip_rate_minus_tcb_ci_low"),
                        r.get("flip_rate_minus_tcb_ci_high"),
                        signed=True,
                        col="minus_tcb",
                    )
                    if diff == diff and diff is not None
                    else td(""),
                ],
                signal=r.signal,
                coverage=r.coverage,
            )
        )
    first = frame.iloc[0]
    out = [
        note(
            f"{first.n_answers} winner answers on {first.n_items} items, {esc(first.split)} families; each signal drops "
            "its most fragile answers and keeps the rest. Flip: some variant of the answer predicts another answer. "
            "Intervals: 95% bootstrap over items; the last column is the signal's flip rate minus δ_TCB's at the same "
            "coverage (paired; above 0: δ_TCB keeps fewer flipping answers)."
        ),
        table(
            ["Signal", "Coverage", "Kept", "Flip rate", "Accuracy", "Flip rate − δ_TCB's"],
            rows,
            table_id="risk-coverage-table",
        ),
    ]
    with tempfile.TemporaryDirectory() as folder:
        path = plot(frame, Path(folder) / "risk_coverage.png")
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    out.append(f'<figure><img alt="risk–coverage" src="data:image/png;base64,{data}" style="max-width:100%"></figure>')
    return "".join(out)


__all__ = ["risk_section"]
