"""`export`, `verify` and `report`: the prompt card production loads, its re-check, and the HTML report."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt import progress
from promptopt.cli.app import ANALYSE, SHIP, app, quiet_libraries
from promptopt.cli.options import CardQuantizeOpt, DeviceOpt, QuietOpt, TieBreakOpt
from promptopt.cli.render import console, print_export


@app.command("export", rich_help_panel=SHIP)
def export_command(
    run_dir: Path = typer.Argument(..., help="a search run directory or a compare directory"),
    out: Path = typer.Option(
        ..., "--out", help="the file to write (lm-eval: the task YAML; its items go beside it as .jsonl)"
    ),
    strategy: str | None = typer.Option(
        None,
        "--strategy",
        help="compare directories: this strategy's winner (default: the selection rule's choice among the searches' winners)",
    ),
    select: str = typer.Option(
        "dev",
        "--select",
        help="compare directories: dev (the selection rule among the searches' winners: those dev cannot tell from the "
        "most accurate tie, --tie-break chooses) or robust (the same rule over every evaluated candidate, tie-break: "
        "dev Acc_worst under the search suite); test items never choose",
    ),
    tie_break: str | None = TieBreakOpt,
    trial: int | None = typer.Option(None, "--trial", help="this trial number instead of the winner"),
    fmt: str = typer.Option(
        "card", "--format", help="card (YAML, version 2), messages (chat JSON), text, or lm-eval (task YAML)"
    ),
    device: str | None = typer.Option(
        None, "--device", help="override the run's device (fingerprints and the token-id hash need the model)"
    ),
    ensemble: int | None = typer.Option(
        None,
        "--ensemble",
        min=2,
        help="K: a K-member ensemble card, its members chosen by greedy forward selection on dev among the run's "
        "finished trials (every search of a compare, or --strategy's); serving it costs K forwards per input",
    ),
    flag_rate: float | None = typer.Option(
        None,
        "--flag-rate",
        help="R: record a fragility threshold that flags a share R of the dev answers (e.g. 0.2), with what it meant "
        "on dev under the search suite: flip rates of flagged and unflagged answers (docs/serving.md#fragility-threshold)",
    ),
    flag_signal: str = typer.Option(
        "auto",
        "--flag-signal",
        help="the flag's signal: tcb, margin, top_prob, entropy, or auto (the largest dev flip-rate gap)",
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Export the winner (or a named trial) of a run as a prompt card that records everything its score depends on."""
    import promptopt.api as api

    quiet_libraries()
    with progress.reporting("export", quiet=quiet):
        exported = api.export(
            run_dir,
            out=out,
            strategy=strategy,
            trial=trial,
            format=fmt,
            device=device,
            select=select,
            ensemble=ensemble,
            flag_rate=flag_rate,
            flag_signal=flag_signal,
            tie_break=tie_break,
        )
    print_export(exported)
    if exported.card.get("fragility"):
        console.print(_flag_line(exported.card["fragility"]), markup=False, highlight=False)


def _flag_line(section: dict) -> str:
    """One line: the card's flag and what it meant on dev (and on test, where the compare measured it)."""

    def rate(side: dict) -> str:
        low, high = side["flip_rate_ci95"]
        value = "—" if side["flip_rate"] is None else f"{side['flip_rate']:.2f}"
        bounds = "" if low is None else f" [{low:.2f}, {high:.2f}]"
        return f"{value}{bounds} of {side['n']}"

    chosen = section["signals"][section["signal"]]
    line = (
        f"flag: {section['signal']} {'<' if section['direction'] == 'below' else '>'} {section['threshold']:.4g} "
        f"(flags {chosen['flagged_share']:.0%} of {section['dev']['n']} dev answers); dev flip rate under "
        f"{section['dev']['suite']}: flagged {rate(chosen['flagged'])}, unflagged {rate(chosen['unflagged'])}"
    )
    test = section.get("test")
    if test:
        line += f"; test (unseen families): flagged {rate(test['flagged'])}, unflagged {rate(test['unflagged'])}"
    return line


@app.command("verify", rich_help_panel=SHIP)
def verify_command(
    card: Path = typer.Argument(..., help="a card written by `promptopt export`"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="re-score only the first N recorded test items"),
    model: str | None = typer.Option(
        None,
        "--model",
        help="score with this model instead of the recorded one (its fingerprint difference fails the check)",
    ),
    device: str = DeviceOpt,
    quantize: str | None = CardQuantizeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Re-score a card on its recorded items with its recorded model (in its recorded precision); exit 1 with the
    differences if anything changed."""
    import promptopt.api as api

    quiet_libraries()
    with progress.reporting("verify", quiet=quiet):
        result = api.verify(card, limit=limit, model=model, device=device, quantize=quantize)
    for line in result.lines():
        console.print(line, markup=False, highlight=False, soft_wrap=True)  # whole lines: each names what it checked
    if not result.ok:
        raise typer.Exit(1)


@app.command("report", rich_help_panel=ANALYSE)
def report_command(
    run_dir: Path = typer.Argument(
        ..., help="a compare or search directory, an `evaluate --out` folder or a `stress` sweep"
    ),
    out: Path | None = typer.Option(None, "--out", help="the HTML file (default: RUN_DIR/report.html)"),
    card: Path | None = typer.Option(
        None, "--card", help="an exported card to show (default: the card `export RUN_DIR` writes, built in memory)"
    ),
    robustness: list[Path] | None = typer.Option(
        None, "--robustness", help="`evaluate --out` family tables (.csv) to plot; repeatable"
    ),
    taboo: list[Path] | None = typer.Option(
        None, "--taboo", help="`stress --out` rank tables (.csv) to plot; repeatable"
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Write one self-contained HTML report (opens offline) that leads with what to ship: the card export writes,
    against the default prompt and the next best, and export's warnings; then the verdict, strategies, robustness
    per family, the card, the search."""
    from promptopt.report import write_report

    quiet_libraries()
    with progress.reporting("report", quiet=quiet):
        path = write_report(run_dir, out=out, card=card, robustness=robustness or [], taboo=taboo or [])
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
