"""`search` and `compare`: one Optuna study, or every strategy with the same budget side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt import progress
from promptopt.cli.app import SEARCH, app, quiet_libraries
from promptopt.cli.options import (
    BatchOpt,
    DecisionOpt,
    DeviceOpt,
    DevLimitOpt,
    DtypeOpt,
    MinibatchOpt,
    ModelOpt,
    ProposeModeOpt,
    ProposerOpt,
    PruningOpt,
    QuantizeOpt,
    QuietOpt,
    ResumeOpt,
    ScreenItemsOpt,
    SearchSuiteOpt,
    SeedOpt,
    SpaceOpt,
    StorageOpt,
    SubsetsOpt,
    TaskOpt,
    TestLimitOpt,
    TieBreakOpt,
    TrustTaskCodeOpt,
    WorkersOpt,
    int_list,
    listing_option,
    names,
)
from promptopt.cli.render import console, print_pairs, print_search_result
from promptopt.cli.render_propose import print_proposals, print_rounds
from promptopt.cli.render_robustness import print_compare

ProposeOpt = typer.Option(
    None,
    "--propose",
    min=1,
    help="N instructions written by --proposer join the space first (docs/search.md#proposals)",
)
IncumbentOpt = typer.Option(
    "default",
    "--incumbent",
    help="the prompt you have, kept unless a searched one beats it on dev (paired): default (the task's), a card's "
    "path, or none (each strategy's own winner, as the papers compared them)",
)
ScanOpt = typer.Option(
    "advise",
    "--scan",
    help="before the trials, say whether searching can pay: advise (say it, search on), stop (also stop unless the "
    "verdict is 'search'), off",
)
ShowRejectedOpt = typer.Option(
    False, "--show-rejected", help="--propose: print every rejected proposal with its reason (the record names them)"
)


@app.command(rich_help_panel=SEARCH)
def search(
    task: str = TaskOpt,
    strategy: str = listing_option(
        "accuracy",
        "--strategy",
        help="one of {names} (docs/search.md#strategies; why accuracy is the default: docs/search.md#the-default)",
        registry="promptopt.study.strategies:STRATEGIES",
    ),
    trials: int = typer.Option(20, "--trials", help="finished (complete or pruned) trials to reach"),
    model: str = ModelOpt,
    storage: str | None = StorageOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(Path("runs/search"), "--out", help="run directory"),
    space: str | None = SpaceOpt,
    study_name: str | None = typer.Option(None, "--study-name", help="default: <task>-<strategy>"),
    resume: bool = ResumeOpt,
    n_workers: int = WorkersOpt,
    minibatch: int = MinibatchOpt,
    pruning: bool = PruningOpt,
    decision: str | None = DecisionOpt,
    tie_break: str | None = TieBreakOpt,
    dev_limit: int | None = DevLimitOpt,
    test_limit: int | None = TestLimitOpt,
    subsets: str | None = SubsetsOpt,
    batch_size: str = BatchOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    propose: int | None = ProposeOpt,
    propose_mode: str = ProposeModeOpt,
    proposer: str | None = ProposerOpt,
    rounds: int = typer.Option(
        1,
        "--rounds",
        min=1,
        help="R > 1: OPRO-style rounds, each proposing from the last one's scored instructions (history mode)",
    ),
    search_suite: str = typer.Option(
        "cheap",
        "--search-suite",
        help="the families the robust strategy trains on and reflect proposals show ('none': no variants)",
    ),
    trust_task_code: bool = TrustTaskCodeOpt,
    screen_items: int | None = ScreenItemsOpt,
    show_rejected: bool = ShowRejectedOpt,
    incumbent: str = IncumbentOpt,
    scan: str = ScanOpt,
    budget: float | None = typer.Option(
        None, "--budget", help="minutes: no trial starts after them (beside --trials, whichever comes first)"
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Search instructions × exemplar sets × orders × templates with Optuna; write the best prompt card."""
    import promptopt.api as api

    quiet_libraries()
    options = {
        "task": task,
        "strategy": strategy,
        "trials": trials,
        "model": model,
        "storage": storage,
        "seed": seed,
        "out": str(out),
        "space": space,
        "study_name": study_name,
        "resume": resume,
        "n_workers": n_workers,
        "minibatch": minibatch,
        "pruning": pruning,
        "decision": decision,
        "tie_break": tie_break,
        "dev_limit": dev_limit,
        "test_limit": test_limit,
        "subsets": subsets,
        "batch_size": batch_size,
        "device": device,
        "dtype": dtype,
        "quantize": quantize,
        "trust_task_code": trust_task_code,
        "incumbent": incumbent,
        "scan": scan,
        "budget_minutes": budget,
    }
    search_suite = None if search_suite == "none" else search_suite
    if rounds > 1:
        from promptopt.workflows import search

        request = search.propose_request(
            propose, propose_mode, proposer, seed, rounds, search_suite=search_suite, screen_items=screen_items
        )
        with progress.reporting("search", quiet=quiet):
            result = search.search_rounds(
                api.search_config(**options), request, rounds, search_suite=search_suite, show_progress=not quiet
            )
        print_rounds(result, show_rejected=show_rejected)
        return
    with progress.reporting("search", quiet=quiet):
        flat = {k: v for k, v in options.items() if k != "budget_minutes"}
        result = api.search(
            **flat,
            budget=budget,
            search_suite=search_suite,
            propose=propose,
            propose_mode=propose_mode,
            proposer=proposer,
            screen_items=screen_items,
            progress=not quiet,
        )
    if result.proposals is not None:
        print_proposals(result.proposals, out / "space.yaml", show_rejected=show_rejected)
    print_search_result(result)


@app.command(rich_help_panel=SEARCH)
def compare(
    task: str = TaskOpt,
    trials: int = typer.Option(20, "--trials", help="the same budget for every strategy"),
    strategies: str = listing_option(
        "ppl,tcb,accuracy",
        "--strategies",
        help="comma-separated strategies of {names}, each optionally with a decision rule: "
        "accuracy,accuracy@batch,robust@affine",
        registry="promptopt.study.strategies:STRATEGIES",
    ),
    model: str = ModelOpt,
    storage: str | None = StorageOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(Path("runs/compare"), "--out", help="run directory"),
    space: str | None = SpaceOpt,
    resume: bool = ResumeOpt,
    n_workers: int = WorkersOpt,
    minibatch: int = MinibatchOpt,
    pruning: bool = PruningOpt,
    tie_break: str | None = TieBreakOpt,
    dev_limit: int | None = DevLimitOpt,
    test_limit: int | None = TestLimitOpt,
    subsets: str | None = SubsetsOpt,
    batch_size: str = BatchOpt,
    suite: str = typer.Option(
        "unseen",
        "--suite",
        help="perturbation suite the winners are judged on (default: the families no search looks at), or 'none'",
    ),
    search_suite: str = SearchSuiteOpt,
    robust_limit: int | None = typer.Option(
        None, "--robust-limit", min=1, help="test items used for robustness (default: all)"
    ),
    seeds: int = typer.Option(
        1, "--seeds", min=1, help="searches per strategy (sampler seed and exemplar candidates vary)"
    ),
    top_n: int = typer.Option(
        3, "--top-n", min=1, help="distinct top trials of each search scored on test items and stressed"
    ),
    select: str = typer.Option(
        "strategy",
        "--select",
        help="strategy: each strategy's own winner; robust: best dev Acc_worst (under --search-suite) among the top-N inside the best dev accuracy's interval",
    ),
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    propose: int | None = ProposeOpt,
    propose_mode: str = ProposeModeOpt,
    proposer: str | None = ProposerOpt,
    ensembles: str | None = typer.Option(
        None,
        "--ensembles",
        help="K[,K...]: per search, a K-member ensemble of its trials chosen on dev (greedy forward selection), "
        "compared beside the winners as <strategy>+ens<K>",
    ),
    ensemble_of: str | None = typer.Option(
        None, "--ensemble-of", help="the strategies whose searches give ensembles (default: every one)"
    ),
    ensemble_objective: str = typer.Option(
        "accuracy",
        "--ensemble-objective",
        help="accuracy, or robust (dev items right under every search-suite variant)",
    ),
    trust_task_code: bool = TrustTaskCodeOpt,
    screen_items: int | None = ScreenItemsOpt,
    show_rejected: bool = ShowRejectedOpt,
    incumbent: str = IncumbentOpt,
    scan: str = ScanOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Run several strategies with the same budget and items; compare their winners on held-out test items
    with intervals and paired tests."""
    import promptopt.api as api

    quiet_libraries()
    with progress.reporting("compare", quiet=quiet):
        result = api.compare(
            task=task,
            strategies=names(strategies),
            trials=trials,
            model=model,
            out=out,
            dev_limit=dev_limit,
            test_limit=test_limit,
            seeds=seeds,
            top_n=top_n,
            select=select,
            suite=suite,
            search_suite=search_suite,
            robust_limit=robust_limit,
            ensembles=int_list(ensembles, "--ensembles") if ensembles else (),
            ensemble_of=names(ensemble_of) or None,
            ensemble_objective=ensemble_objective,
            tie_break=tie_break,
            space=space,
            seed=seed,
            storage=storage,
            resume=resume,
            n_workers=n_workers,
            minibatch=minibatch,
            pruning=pruning,
            subsets=subsets,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            quantize=quantize,
            trust_task_code=trust_task_code,
            propose=propose,
            propose_mode=propose_mode,
            proposer=proposer,
            screen_items=screen_items,
            incumbent=incumbent,
            scan=scan,
            progress=not quiet,
        )
    if result.proposals is not None:
        print_proposals(result.proposals, out / "space.yaml", show_rejected=show_rejected)
    print_compare(result, task, model)
    items = ", robustness_items.parquet" if result.summary.get("suite") else ""
    console.print(
        f"wrote {out / 'compare.csv'}, compare_runs.csv, compare_paired.csv, test_items.parquet{items}, summary.json and one run "
        f"directory per strategy under {out}"
    )


@app.command("propose", rich_help_panel=SEARCH)
def propose_command(
    task: str = TaskOpt,
    n: int = typer.Option(12, "--n", min=1, help="instructions to add"),
    out: Path = typer.Option(..., "--out", help="the space file to write (YAML)"),
    space: str | None = SpaceOpt,
    mode: str = typer.Option(
        "grounded",
        "--mode",
        help="induce, grounded, history (from the space's own instructions scored on dev) or reflect",
    ),
    proposer: str | None = ProposerOpt,
    model: str = ModelOpt,
    seed: int = typer.Option(0, "--seed", help="same seed, same proposals"),
    search_suite: str = typer.Option(
        "cheap", "--search-suite", help="reflect: the families whose answer changes it shows"
    ),
    dev_limit: int | None = DevLimitOpt,
    test_limit: int | None = TestLimitOpt,
    subsets: str | None = SubsetsOpt,
    cache: Path | None = typer.Option(
        None, "--cache", help="where proposals are remembered by content hash (default: $PROMPTOPT_CACHE/proposals)"
    ),
    batch_size: str = BatchOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
    screen_items: int | None = ScreenItemsOpt,
    show_rejected: bool = typer.Option(
        True, "--show-rejected/--hide-rejected", help="print every rejected text with its reason (default: shown)"
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Write a search space: the given one plus N instructions a model proposes, filtered and screened on dev
    against the space's best hand-written instruction, with provenance; the record beside it names every text."""
    from promptopt.workflows import search

    quiet_libraries()
    request = search.propose_request(
        n, mode, proposer, seed, 1, search_suite=search_suite, standalone=True, screen_items=screen_items
    )
    with progress.reporting("propose", quiet=quiet):
        proposed = search.propose(
            task=task,
            model=model,
            device=device,
            dtype=dtype,
            quantize=quantize,
            subsets=subsets,
            dev_limit=dev_limit,
            test_limit=test_limit,
            batch_size=batch_size,
            request=request,
            space=space,
            out=out,
            cache=cache,
            trust_task_code=trust_task_code,
        )
    print_proposals(proposed.proposals, out, show_rejected=show_rejected, record=proposed.record)


@app.command("pair", rich_help_panel=SEARCH)
def pair_command(
    run_a: Path = typer.Argument(..., help="a finished compare directory"),
    run_b: Path = typer.Argument(..., help="another one, on the same task, model, test items and judged families"),
    out: Path | None = typer.Option(None, "--out", help="write the paired table (.csv or .parquet)"),
) -> None:
    """Pair two compares strategy by strategy, seed by seed and item by item (a − b): e.g. a space grown by
    --propose against the hand-written one."""
    from promptopt.workflows import pair_runs

    print_pairs(pair_runs.pair_to_file(run_a, run_b, out), run_a, run_b)
