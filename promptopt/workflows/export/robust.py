"""`export --select robust`: choosing after the fact among every prompt a compare evaluated, by the selection rule
(metrics/stats/selection.py) with tie-break `robust`: the candidates not significantly worse than the most
dev-accurate on the same dev items tie, and the best dev Acc_worst under a suite (measured now, on dev items, for the
tied candidates only) chooses."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from promptopt.workflows.export.runs import decode_trial, load_study, open_run, pick_trial
from promptopt.workflows.export.select import candidate_of, plain_row
from promptopt.workflows.session import Session


def select_robust(root: Path, candidates, *, device: str | None = None, suite: str = "cheap", limit: int | None = None):
    """Among every prompt the compare evaluated (each search's top-N), the selection rule's choice with tie-break
    `robust`: dev Acc_worst under `suite` (default: the families the `robust` strategy sees; measured now on dev items,
    through the compare's result cache, each prompt's answers decided by its own rule fit on those dev items, as the
    compare's `--select robust` decides them), for the tied candidates only.
    -> (compare_runs row with "selection" and "selection_detail", session)."""
    from promptopt.metrics.stats.selection import choose
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.scoring.calibration import deciding_scorer

    the_suite = load_suite(suite)
    rows = [plain_row(r) for _, r in candidates.iterrows()]
    by_order = {int(r["order"]): r for r in rows}
    first = open_run(root, pick=dict(rows[0]))
    config = first.config if device is None else first.config.replace(device=device)
    session = Session(model=config.model, data=config.data, out=root, batch_size=config.batch_size)
    dev, similarity, seen = session.items("dev", limit), Similarity(), {}

    def measure(tied):
        out = []
        for c in tied:
            row = by_order[c.key]
            run = open_run(root, pick=dict(row))
            prompt = decode_trial(run, session.data, pick_trial(run, load_study(run, session.data), None).params)
            key = json.dumps(prompt.to_card(), sort_keys=True)
            if key not in seen:  # a prompt two searches share is stressed once
                scorer, _ = deciding_scorer(session.scorer, prompt, dev)  # answers decided by the prompt's own rule
                seen[key] = evaluate_robustness(
                    scorer,
                    prompt,
                    dev,
                    the_suite,
                    pool=session.data.pool,
                    similarity=similarity,
                    paraphrases=session.paraphrases,
                ).summary["acc_worst"]
            out.append(replace(c, robust=float(seen[key])))
        return out

    selection = choose([candidate_of(r) for _, r in candidates.iterrows()], tie_break="robust", fill=measure)
    chosen = dict(by_order[selection.winner.key])
    chosen["selection"] = (
        f"--select robust (suite {the_suite.name}, {len(dev)} dev items) among {len(rows)} evaluated candidates: "
        f"{selection.describe()}"
    )
    chosen["selection_detail"] = selection.record()
    return chosen, session
