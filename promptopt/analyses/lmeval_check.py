"""`promptopt check-lmeval`: one task scored by promptopt and by lm-evaluation-harness on the same items, compared
item by item.

promptopt reads the task (any form: its own schema, an lm-eval task file, `lmeval:NAME`) with the splits in the
source's order, so its first N test items are lm-eval's first N docs of the evaluated split (`--limit N`). lm-eval
runs its own task file (the same file when `--task` is one, else `--lmeval-task`) through its TaskManager on the
same model folder (`promptopt model-folder`), with its model loaded before the clock starts. Per item: whether both
sent the same requests (context and continuation strings), both predictions (acc's argmax and acc_norm's, from
lm-eval's own log-likelihoods and choices), the largest log-likelihood difference, and for generate_until tasks the
extracted answers and exact_match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.errors import ConfigError, UserError
from promptopt.tasks.catalog import LMEVAL_PREFIX
from promptopt.tasks.lm_eval_manager import EXTRA, lm_eval_installed


class LmEvalNotInstalled(UserError):
    """lm-eval is not installed: nothing was compared, which is a failure (exit 2, one line), never a pass."""


@dataclass
class LmEvalCheck:
    task: str
    lm_eval_task: str
    model: str
    split: str
    output_type: str
    table: pd.DataFrame  # one row per item
    ours: dict = field(default_factory=dict)  # accuracies, seconds, items/s
    theirs: dict = field(default_factory=dict)


def lm_eval_target(task: str, lmeval_task: str | None, spec, trust: bool) -> tuple[str, str | None, str]:
    """(lm-eval task name, include folder or None, how to show it) of the task lm-eval is to run."""
    from promptopt.tasks.lm_eval_task import _with_includes
    from promptopt.tasks.paths import task_root
    from promptopt.tasks.task_code import TRUST_FLAG, contains_function, read_task_yaml

    target = lmeval_task or (task if spec.dialect == "lm-eval" else None)
    if target is None:
        raise UserError(
            f"--task {task} is written in promptopt's schema: give --lmeval-task (lm-eval's own task file for it, or "
            "lmeval:NAME) to compare with"
        )
    if target.startswith(LMEVAL_PREFIX):
        name, _, folder = target[len(LMEVAL_PREFIX) :].partition("@")
        if folder and not trust:
            raise UserError(f"{target}: lm-eval imports the Python of {folder}'s task files: pass {TRUST_FLAG}")
        return name, folder or None, target
    # includes resolved as the task reader resolves them: inside the task's folder tree unless the task is trusted
    data, _ = _with_includes(read_task_yaml(target), target, None if trust else task_root(target))
    if contains_function(data) and not trust:
        raise UserError(f"{target}: lm-eval runs its !function hooks (the task's own Python): pass {TRUST_FLAG}")
    if not isinstance(data.get("task"), str):
        raise ConfigError(f"{target}: task: expected the name of an lm-eval task (this is not an lm-eval task file)")
    return data["task"], str(Path(target).parent), target


def _check_split(data) -> str:
    """The evaluated split; the test role must take it alone, in its order, for item i to be lm-eval's doc i."""
    spec = data.spec
    split = spec.splits["test"].source_split
    shared = [role for role, s in spec.splits.items() if role != "test" and s.source_split == split]
    if shared:
        raise UserError(
            f"{spec.where}: test shares the source split '{split}' with {shared[0]}: check-lmeval compares lm-eval's "
            f"first docs of '{split}', so the test items must be that split alone"
        )
    return split


def check_lmeval(
    *,
    task: str,
    lmeval_task: str | None = None,
    model: str = "smollm2-135m-instruct",
    device: str = "cpu",
    dtype: str | None = None,
    limit: int | None = None,
    batch_size: int = 16,
    trust_task_code: bool = False,
) -> LmEvalCheck:
    from promptopt.models import ModelConfig
    from promptopt.models.load import model_folder
    from promptopt.tasks import DataConfig
    from promptopt.workflows.session import Session

    session = Session(
        model=ModelConfig(spec=model, device=device, dtype=dtype),
        data=DataConfig(task=task, trust_task_code=trust_task_code, order="source"),
        batch_size=batch_size,
    )
    data = session.data
    split = _check_split(data)
    name, folder, shown = lm_eval_target(task, lmeval_task, data.spec, trust_task_code)
    if not lm_eval_installed():
        raise LmEvalNotInstalled(f"check-lmeval: lm-eval is not installed, so nothing was compared: {EXTRA}")
    items, prompt = data.test[:limit], data.default_prompt()
    scorer = session.scorer
    start = time.perf_counter()
    result = scorer.score(prompt, items)
    ours_seconds = time.perf_counter() - start
    from promptopt.analyses.lmeval_run import run_lm_eval

    lm = scorer.lm
    samples, lm_task, theirs_seconds = run_lm_eval(
        name,
        folder,
        model_folder(model),
        device=str(lm.device),
        dtype=str(lm.model.dtype).removeprefix("torch."),
        limit=len(items),
        batch_size=batch_size,
    )
    if len(samples) != len(items):
        raise UserError(f"lm-eval scored {len(samples)} docs of {name}, promptopt {len(items)} items")
    generative = data.spec.generative
    rows = (_generative_rows if generative else _choice_rows)(scorer, prompt, items, result.table, samples, lm_task)
    table = pd.DataFrame(rows)
    n = len(items)
    ours = {"seconds": ours_seconds, "items_per_second": n / ours_seconds}
    theirs = {"seconds": theirs_seconds, "items_per_second": n / theirs_seconds}
    for key in ("acc", "acc_norm", "correct"):
        if f"ours_{key}" in table:
            ours[key] = float(table[f"ours_{key}"].mean())
            reported = table[f"lm_eval_{key}"].dropna()  # None where lm-eval's task does not report the metric
            theirs[key] = float(reported.astype(float).mean()) if len(reported) else None
    return LmEvalCheck(
        task=data.spec.name,
        lm_eval_task=shown,
        model=model,
        split=split,
        output_type="generate_until" if generative else "multiple_choice",
        table=table,
        ours=ours,
        theirs=theirs,
    )


def _choice_rows(scorer, prompt, items, ours, samples, lm_task) -> list[dict]:
    contexts, conts, _, owners = scorer._choice_requests(prompt, items)
    rows = []
    for i, (item, sample) in enumerate(zip(items, samples)):
        mine = [(c, t) for c, t, o in zip(contexts, conts, owners) if o == i]
        theirs_requests = [tuple(a[:2]) for a in sample["arguments"]]
        lls = np.array([float(r[0]) for r in sample["filtered_resps"]])
        choices = lm_task.doc_to_choice(sample["doc"])
        lengths = np.array([float(len(c)) for c in choices])
        row = ours.iloc[i]
        mine_lls = np.array(row["choice_logprobs"])
        rows.append(
            {
                "item_id": item.id,
                "doc_id": int(sample["doc_id"]),
                "same_requests": mine == theirs_requests,
                "ours_pred": int(row["pred"]),
                "lm_eval_pred": int(lls.argmax()),
                "ours_pred_norm": int(row["pred_norm"]),
                "lm_eval_pred_norm": int((lls / lengths).argmax()),
                "ours_acc": bool(row["acc"]),
                "lm_eval_acc": bool(sample.get("acc", 0.0)),
                "ours_acc_norm": bool(row["acc_norm"]),
                "lm_eval_acc_norm": bool(sample["acc_norm"]) if "acc_norm" in sample else None,
                "max_abs_logprob_diff": float(np.abs(mine_lls - lls).max()) if len(mine_lls) == len(lls) else np.inf,
            }
        )
    return rows


def _generative_rows(scorer, prompt, items, ours, samples, lm_task) -> list[dict]:
    tok = scorer.lm.tokenizer
    rows = []
    for i, (item, sample) in enumerate(zip(items, samples)):
        row = ours.iloc[i]
        answer = sample["filtered_resps"][0]
        rows.append(
            {
                "item_id": item.id,
                "doc_id": int(sample["doc_id"]),
                "same_requests": prompt.context(item.question, item.choices, tok) == sample["arguments"][0][0],
                "ours_answer": str(row["pred"]),
                "lm_eval_answer": answer if isinstance(answer, str) else str(answer),
                "ours_correct": bool(row["correct"]),
                "lm_eval_correct": bool(sample.get("exact_match", 0.0)),
            }
        )
    return rows
