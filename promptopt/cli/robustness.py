"""`evaluate` and `stress`: a prompt under a perturbation suite, and under taboo decoding (one task, or the
taboo paper's sweep over models and tasks)."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt import progress
from promptopt.cli.app import EVALUATE, app, quiet_libraries, session, split_subsets
from promptopt.cli.options import (
    BatchOpt,
    CardOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    QuantizeOpt,
    QuietOpt,
    SearchSuiteOpt,
    SubsetsOpt,
    TaskOpt,
    TrustTaskCodeOpt,
    int_list,
    listing_option,
    names,
)
from promptopt.cli.render import console, print_stress, print_stress_sweep
from promptopt.cli.render_robustness import print_robustness
from promptopt.errors import UserError


@app.command(rich_help_panel=EVALUATE)
def evaluate(
    task: str = TaskOpt,
    prompt: Path | None = CardOpt,
    suite: str = listing_option(
        "default",
        "--suite",
        help="built-in suite ({suites}) or a suite YAML, whose families use the registered perturbation operators: "
        "{names} (docs/robustness.md)",
        registry={
            "suites": "promptopt.robustness.suite.spec:builtin_suite_names",
            "names": "promptopt.robustness.perturb:OPERATORS",
        },
    ),
    search_suite: str = SearchSuiteOpt,
    model: str = ModelOpt,
    split: str = typer.Option("test", "--split", help="dev or test"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="only the first N items"),
    out: Path | None = typer.Option(
        None, "--out", help="OUT: write families (OUT.csv), a summary (OUT.json) and every answer (OUT_items.parquet)"
    ),
    subsets: str | None = SubsetsOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Robustness of a prompt under a perturbation suite: per-family accuracy, PDR, AccVar, Acc_worst, each family
    labelled seen or unseen by --search-suite."""
    from promptopt.workflows import evaluate

    the_session = session(task, model, device, dtype, quantize, subsets, trust_task_code=trust_task_code)
    with progress.reporting("evaluate", quiet=quiet):
        the_suite, result = evaluate.evaluate(
            the_session,
            card=prompt,
            suite=suite,
            split=split,
            limit=limit,
            out=out,
            search_suite=None if search_suite == "none" else search_suite,
        )
    print_robustness(result, the_session.data.spec.name, the_suite.name)


@app.command(rich_help_panel=EVALUATE)
def stress(
    task: str | None = typer.Option(
        None, "--task", help="a generative task (number, alias_match, multiple_choice_gen or code answers)"
    ),
    tasks: str | None = typer.Option(
        None, "--tasks", help="sweep: comma-separated generative tasks (with --models and --out)"
    ),
    prompt: Path | None = CardOpt,
    protocol: str | None = typer.Option(
        None,
        "--protocol",
        help="a stress protocol: taboo-paper (the paper's 2-shot CoT, 512 tokens, Answer: lines) or a YAML path",
    ),
    ranks: str | None = typer.Option(
        None, "--ranks", help="taboo ranks i (top-i masked); default 1,2,4,8 or the protocol's"
    ),
    mid_word: bool = typer.Option(False, "--mid-word", help="ablation: mask only where the nominal token is mid-word"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy; > 0 samples with --seed"),
    seed: int = typer.Option(0, "--seed"),
    model: str = ModelOpt,
    models: str | None = typer.Option(
        None, "--models", help="sweep: comma-separated models (hub ids, folders, .gguf, embedded names)"
    ),
    split: str | None = typer.Option(
        None, "--split", help="pool, dev or test (default test; a protocol names its own)"
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="the first N items (of the protocol's subsample, with --protocol)"
    ),
    batch_size: str = BatchOpt,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="one task: write the per-rank table (.csv) and per-item rows (.parquet); sweep: the sweep folder",
    ),
    subsets: str | None = SubsetsOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Decoding-level taboo stress: retention (95% Wilson CI), injected surprisal and length expansion per rank;
    with --models/--tasks, the paper's sweep (Figures 1, 3 and 8), resumable."""
    from promptopt.analyses import stress_sweep
    from promptopt.robustness.protocol import load_protocol
    from promptopt.workflows import evaluate

    quiet_libraries()
    the_protocol = load_protocol(protocol) if protocol else None
    rank_list = int_list(ranks, "--ranks") if ranks else (the_protocol.ranks if the_protocol else (1, 2, 4, 8))
    mode = "mid_word" if mid_word else "word_initial"
    if the_protocol is not None and split is not None:
        raise UserError(
            f"--split: protocol {the_protocol.name} draws its items from its own split ({the_protocol.split}); drop --split"
        )
    split = split or (the_protocol.split if the_protocol else "test")
    if tasks is not None or models is not None:
        if prompt is not None:
            raise UserError(
                "--prompt: a sweep runs each task's own prompt, or the protocol's (--protocol); give one --task to stress a card"
            )
        if out is None:
            raise UserError(
                "a sweep (--models/--tasks) needs --out FOLDER: finished conditions are kept there, so a rerun resumes"
            )
        task_list = names(tasks or task)
        with progress.reporting("stress", quiet=quiet):  # each condition's decoding reports as it goes
            result = stress_sweep.sweep_from_options(
                tasks=task_list,
                models=names(models or model),
                protocol=the_protocol,
                ranks=rank_list,
                mode=mode,
                temperature=temperature,
                seed=seed,
                split=split,
                limit=limit,
                out=out,
                subsets=split_subsets(subsets),
                device=device,
                dtype=dtype,
                quantize=quantize,
                batch_size=batch_size,
                log=console.print,
                trust_task_code=trust_task_code,
            )
        print_stress_sweep(result, task_list, mode, the_protocol.name if the_protocol else None, out)
        return
    if task is None:
        raise UserError("stress: give --task (one task) or --tasks/--models (a sweep)")
    the_session = session(task, model, device, dtype, quantize, subsets, batch_size, trust_task_code=trust_task_code)
    with progress.reporting("stress", quiet=quiet):
        run = evaluate.stress(
            the_session,
            card=prompt,
            protocol=the_protocol,
            split=split,
            limit=limit,
            ranks=rank_list,
            mode=mode,
            temperature=temperature,
            seed=seed,
            batch_size=batch_size,
            out=out,
        )
    title = f"taboo stress · {run.data.spec.name} · {'mid-word' if mid_word else 'word-initial'}" + (
        f" · protocol {the_protocol.name}" + (f" (prompt {prompt})" if prompt else "") if the_protocol else ""
    )
    print_stress(run.result.summary, title)
