"""`promptopt export`: pick the winner (or a named trial) of a search or compare run and write a card
version 2 — everything its score depends on (promptopt/card_schema.json) — or a derived form: chat
messages, a plain text template, or an lm-evaluation-harness task.

The model is loaded (one session, the run's own result cache, so the winner's scores are not recomputed)
because fingerprints and the token-id hash need its tokenizer. Everything is checked before anything is
written, and each file is written atomically: a failed export leaves nothing behind.

- workflow.py: export_run, top to bottom · select.py: a compare's candidates, the dev-accuracy winner
- runs.py: a finished run directory, its study, the trial and the prompt it decodes to
- robust.py: `--select robust`, dev Acc_worst among the accurate candidates, measured now
- measure.py: the numbers a card records · build.py: the card itself, checked against the light loader
"""

from promptopt.workflows.export.build import answer_section, build_card, render_check, rendering_section
from promptopt.workflows.export.measure import bootstrap_mean_ci, measured
from promptopt.workflows.export.robust import select_robust
from promptopt.workflows.export.runs import (
    Run,
    decode_trial,
    instruction_provenance,
    load_study,
    open_run,
    pick_trial,
    winner_number,
)
from promptopt.workflows.export.select import EXPORT_SELECTIONS, compare_candidates, select_by_dev
from promptopt.workflows.export.workflow import FORMATS, MIN_CLEAN_CORRECT, Exported, export_run

__all__ = [
    "FORMATS",
    "MIN_CLEAN_CORRECT",
    "EXPORT_SELECTIONS",
    "Exported",
    "Run",
    "answer_section",
    "bootstrap_mean_ci",
    "build_card",
    "compare_candidates",
    "decode_trial",
    "export_run",
    "instruction_provenance",
    "load_study",
    "measured",
    "open_run",
    "pick_trial",
    "render_check",
    "rendering_section",
    "select_by_dev",
    "select_robust",
    "winner_number",
]
