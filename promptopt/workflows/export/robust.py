"""`export --select robust`: choosing after the fact, among every prompt a compare evaluated whose dev accuracy is
inside the best one's 95% interval, the best dev Acc_worst under a suite (measured now, on dev items)."""

from __future__ import annotations

import json
from pathlib import Path

from promptopt.workflows.export.runs import decode_trial, load_study, open_run, pick_trial
from promptopt.workflows.export.select import plain_row
from promptopt.workflows.session import Session


def select_robust(root: Path, candidates, *, device: str | None = None, suite: str = "cheap", limit: int | None = None):
    """Among every prompt the compare evaluated (each search's top-N) whose dev accuracy is inside the best one's
    95% Wilson interval, the best dev Acc_worst under `suite` (default: the families the `robust` strategy sees;
    measured now on dev items, through the compare's result cache, each prompt's answers decided by its own rule
    fit on those dev items, as the compare's `--select robust` decides them). -> (compare_runs row with "selection", session)."""
    from promptopt.metrics.stats import wilson_interval
    from promptopt.robustness.suite import Similarity, evaluate_robustness, load_suite
    from promptopt.scoring.calibration import deciding_scorer

    the_suite = load_suite(suite)
    rows = [plain_row(r) for _, r in candidates.iterrows()]
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
        scored.append((seen[key], row["dev_accuracy"], -row["order"], row))
    acc_worst, _, _, chosen = max(scored, key=lambda x: x[:3])
    chosen["selection"] = (
        f"best dev Acc_worst ({acc_worst:.3f}, suite {the_suite.name}, {len(dev)} dev items) among {len(eligible)} "
        f"of {len(rows)} evaluated candidates whose dev accuracy is inside the best one's 95% interval "
        f"(≥ {low:.3f}); no test number was read"
    )
    return chosen, session
