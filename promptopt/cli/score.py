"""`score` and `trace`: one prompt on a task's items, and one generation token by token."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt import progress
from promptopt.cli.app import ANALYSE, EVALUATE, app, quiet_libraries, session
from promptopt.cli.options import (
    BatchOpt,
    CardOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    QuietOpt,
    SubsetsOpt,
    TaskOpt,
    TrustTaskCodeOpt,
)
from promptopt.cli.render import console, print_score, print_trace


@app.command(rich_help_panel=EVALUATE)
def score(
    task: str = TaskOpt,
    prompt: Path | None = CardOpt,
    model: str = ModelOpt,
    limit: int | None = typer.Option(
        None,
        "--limit",
        min=1,
        help="score only the first N items of the split as carved: a seeded shuffle of the source split "
        "(splits.order: shuffled, promptopt's default), or its own order (splits.order: source, lm-eval task files, "
        "--order source: then lm-eval's first N docs when the split is test's alone)",
    ),
    split: str = typer.Option("test", "--split", help="pool, dev or test"),
    order: str | None = typer.Option(
        None,
        "--order",
        help="carve the splits in the source's own order (source: lm-eval's order, no shuffle) or shuffled; "
        "default: the task's splits.order",
    ),
    trust_task_code: bool = TrustTaskCodeOpt,
    subsets: str | None = SubsetsOpt,
    batch_size: str = BatchOpt,
    out: Path | None = typer.Option(
        None, "--out", help="write the per-item table (.parquet or .csv) and a .json summary"
    ),
    rows: int = typer.Option(20, "--rows", min=0, help="how many item rows to print"),
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = typer.Option(
        None,
        "--quantize",
        help="4bit (NF4) or 8bit (LLM.int8) through bitsandbytes, or none; default: the --prompt card's precision "
        "(model.quantization), else full precision",
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Score a prompt on a task: per-item correctness, δ_TCB, V_eff, margin and PPL, then a summary."""
    from promptopt.workflows import evaluate
    from promptopt.yamlio import check_table_path

    if out is not None:
        check_table_path(out)
    dtype, quantize = evaluate.card_precision(prompt, dtype, quantize)
    the_session = session(
        task, model, device, dtype, quantize, subsets, batch_size, trust_task_code=trust_task_code, order=order
    )
    with progress.reporting("score", quiet=quiet):
        result = evaluate.score(the_session, card=prompt, split=split, limit=limit, out=out)
    print_score(result, the_session.data.spec.name, split, the_session.lm.name, rows)
    if out is not None:
        console.print(f"wrote {out} and {out.with_suffix('.json')}")


@app.command(rich_help_panel=ANALYSE)
def trace(
    text: str = typer.Argument(..., help="the prompt to continue"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", min=1),
    model: str = ModelOpt,
    chat: bool | None = typer.Option(
        None, "--chat/--plain", help="wrap TEXT in the chat template (default: if the model has one)"
    ),
    dip_ratio: float = typer.Option(
        0.5, "--dip-ratio", help="flag a token whose δ_TCB falls below this fraction of the running median"
    ),
    window: int = typer.Option(8, "--window", min=2, help="tokens in the running median"),
    out: Path | None = typer.Option(None, "--out", help="write the per-token table (.parquet or .csv)"),
    plot: Path | None = typer.Option(None, "--plot", help="write the paper's Fig. 4 panels (.png or .svg)"),
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Generate greedily and print δ_TCB, V_eff, margin, P(2nd best), −log p and running PPL of every token, flagging δ_TCB dips."""
    from promptopt.workflows import evaluate

    quiet_libraries()
    with progress.reporting("trace", quiet=quiet):
        frame, model_name = evaluate.trace(
            text,
            model=model,
            device=device,
            dtype=dtype,
            max_new_tokens=max_new_tokens,
            chat=chat,
            dip_ratio=dip_ratio,
            window=window,
            out=out,
            plot=plot,
        )
    print_trace(frame, model_name)
    for path in (out, plot):
        if path is not None:
            console.print(f"wrote {path}")
