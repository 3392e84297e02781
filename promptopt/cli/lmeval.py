"""`check-lmeval`: a task scored by promptopt and by lm-evaluation-harness on the same items, side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt.cli.app import OTHER, app, quiet_libraries
from promptopt.cli.options import BatchOpt, DeviceOpt, DtypeOpt, ModelOpt, TaskOpt, TrustTaskCodeOpt
from promptopt.cli.render import console


@app.command("check-lmeval", rich_help_panel=OTHER)
def check_lmeval_command(
    task: str = TaskOpt,
    lmeval_task: str | None = typer.Option(
        None,
        "--lmeval-task",
        help="lm-eval's own task file (or lmeval:NAME) to compare with; default: --task itself, when it is one",
    ),
    model: str = ModelOpt,
    limit: int | None = typer.Option(
        100, "--limit", min=1, help="the first N docs of the evaluated split (lm-eval's order), for both tools"
    ),
    out: Path | None = typer.Option(None, "--out", help="write the per-item comparison (.csv or .parquet)"),
    rows: int = typer.Option(0, "--rows", min=0, help="how many item rows to print (disagreements first)"),
    batch_size: str = BatchOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
) -> None:
    """Score a task with promptopt and with lm-eval on the same items; print per-item agreement and both accuracies
    (without lm-eval installed: one error line, exit 2: nothing was compared)."""
    from promptopt.analyses.lmeval_check import check_lmeval
    from promptopt.yamlio import check_table_path, write_table

    quiet_libraries()
    if out is not None:
        check_table_path(out)
    result = check_lmeval(
        task=task,
        lmeval_task=lmeval_task,
        model=model,
        device=device,
        dtype=dtype,
        limit=limit,
        batch_size=batch_size,
        trust_task_code=trust_task_code,
    )
    if out is not None:
        write_table(result.table, out)
    print_check(result, rows)
    if out is not None:
        console.print(f"wrote {out}")


def print_check(result, rows: int) -> None:
    table, n = result.table, len(result.table)
    console.print(
        f"check-lmeval · {result.task} (promptopt) vs {result.lm_eval_task} (lm-eval) · {result.model} · the first {n} "
        f"docs of '{result.split}' · {result.output_type}"
    )
    console.print(f"  same requests (context and continuation strings): {int(table['same_requests'].sum())}/{n}")
    if result.output_type == "multiple_choice":
        agree = int((table["ours_pred"] == table["lm_eval_pred"]).sum())
        agree_norm = int((table["ours_pred_norm"] == table["lm_eval_pred_norm"]).sum())
        console.print(
            f"  identical predictions: acc {agree}/{n}, acc_norm {agree_norm}/{n}; largest |Δ log-likelihood| of a "
            f"choice {table['max_abs_logprob_diff'].max():.2e}"
        )
        theirs_norm = result.theirs.get("acc_norm")
        reported = "n/a (its task reports acc only)" if theirs_norm is None else f"{theirs_norm:.3f}"
        console.print(
            f"  accuracy: promptopt acc {result.ours['acc']:.3f}, acc_norm {result.ours['acc_norm']:.3f} · lm-eval acc "
            f"{result.theirs['acc']:.3f}, acc_norm {reported}"
        )
        disagree = table["ours_pred"] != table["lm_eval_pred"]
    else:
        agree = int((table["ours_answer"] == table["lm_eval_answer"]).sum())
        same = int((table["ours_correct"] == table["lm_eval_correct"]).sum())
        console.print(f"  identical extracted answers {agree}/{n}; same exact_match {same}/{n}")
        console.print(
            f"  accuracy (exact_match): promptopt {result.ours['correct']:.3f} · lm-eval {result.theirs['correct']:.3f}"
        )
        disagree = table["ours_answer"] != table["lm_eval_answer"]
    console.print(
        f"  time: promptopt {result.ours['seconds']:.1f} s ({result.ours['items_per_second']:.2f} items/s, its score "
        f"call) · lm-eval {result.theirs['seconds']:.1f} s ({result.theirs['items_per_second']:.2f} items/s, its "
        "simple_evaluate call, model loaded before)"
    )
    if rows:
        shown = table.iloc[list(disagree.to_numpy().nonzero()[0]) + list((~disagree).to_numpy().nonzero()[0])][:rows]
        console.print(shown.to_string(index=False))
