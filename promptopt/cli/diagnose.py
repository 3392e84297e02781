"""The `diagnose` group: the papers' analyses of a model (geometry, regimes, approx, taboo, conflicts) and
of a run (proxy)."""

from __future__ import annotations

from pathlib import Path

import typer

from promptopt import progress
from promptopt.cli.app import DIAGNOSE_MODEL, DIAGNOSE_RUN, diagnose_app, quiet_libraries, session
from promptopt.cli.options import (
    BatchOpt,
    CardOpt,
    DeviceOpt,
    DiagnoseLimitOpt,
    DiagnoseOutOpt,
    DiagnoseTasksOpt,
    DiagnoseTextOpt,
    DiagnoseTraceOpt,
    DtypeOpt,
    ModelOpt,
    QuantizeOpt,
    QuietOpt,
    SearchSuiteOpt,
    SubsetsOpt,
    TrustTaskCodeOpt,
    int_list,
    names,
)
from promptopt.cli.render import (
    console,
    print_approx,
    print_conflicts,
    print_geometry,
    print_regimes,
    print_taboo_sweep,
)
from promptopt.cli.render_robustness import print_proxy


def _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens):
    from promptopt.analyses.diagnose.positions import PositionSpec
    from promptopt.models import ModelConfig

    quiet_libraries()
    spec = PositionSpec(tasks=tuple(names(tasks)), limit=limit, text_per_task=text_per_task, trace_tokens=trace_tokens)
    progress.step(f"loading model {model}")
    return ModelConfig(spec=model, device=device, dtype=dtype).load(), spec


def _given(**values) -> dict:
    return {k: v for k, v in values.items() if v is not None}


@diagnose_app.command("proxy", rich_help_panel=DIAGNOSE_RUN)
def diagnose_proxy(
    run_dirs: list[Path] = typer.Argument(
        ...,
        help="search run directories of one task and model (e.g. every strategy/seed folder of a compare run), their trials pooled; or compare / evaluate folders (or *_items.parquet files) whose kept answers give the item-level AUROC alone",
    ),
    trials: int = typer.Option(
        8, "--trials", min=3, help="distinct prompts (spread over each study's values) to stress"
    ),
    limit: int | None = typer.Option(40, "--limit", min=1, help="dev items per prompt"),
    suite: str = typer.Option(
        "unseen",
        "--suite",
        help="perturbation suite that measures robustness (default: the families no search looks at)",
    ),
    search_suite: str = SearchSuiteOpt,
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="folder for proxy_prompts.csv, proxy_correlations.csv, proxy_items.parquet and proxy_item_auroc.csv (default: the run directory, or the runs' common parent)",
    ),
    quiet: bool = QuietOpt,
) -> None:
    """Is δ_TCB a good proxy for robustness here? Spearman ρ of cheap signals vs measured Acc_worst and PDR across
    prompts, and across answers the AUROC of each clean signal for "this answer changes under an unseen perturbation"."""
    from promptopt.analyses.proxy import diagnose_proxy as run_proxy

    quiet_libraries()
    with progress.reporting("diagnose proxy", quiet=quiet):
        result = run_proxy(
            run_dirs,
            n_trials=trials,
            limit=limit,
            suite=suite,
            search_suite=None if search_suite == "none" else search_suite,
            seed=seed,
            out=out,
            show_progress=progress.bars(),
        )
    print_proxy(result, len(run_dirs))


@diagnose_app.command("geometry", rich_help_panel=DIAGNOSE_MODEL)
def diagnose_geometry(
    k: int = typer.Option(10, "--k", min=1, help="competitors moved (the most probable tokens after the top-1)"),
    alpha: float = typer.Option(0.5, "--alpha", help="cluster: w_j + α (w_top − w_j)"),
    beta: float = typer.Option(0.5, "--beta", help="disperse: w_j − β (w_top − w_j)"),
    tasks: str = DiagnoseTasksOpt,
    limit: int = DiagnoseLimitOpt,
    text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt,
    out: Path = DiagnoseOutOpt,
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """δ_TCB paper Table 2: share of positions with δ_cluster > δ_orig > δ_disperse (h and o fixed; and o recomputed)."""
    from promptopt.analyses.diagnose.workflows import run_geometry

    with progress.reporting("diagnose geometry", quiet=quiet):
        lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
        report = run_geometry(lm, spec, out, k=k, alpha=alpha, beta=beta, progress=progress.bars())
    print_geometry(report, lm.name, k, alpha, beta)


@diagnose_app.command("regimes", rich_help_panel=DIAGNOSE_MODEL)
def diagnose_regimes(
    low_v_eff: float = typer.Option(2.0, "--low-veff", help="the low-V_eff subset: V_eff below this"),
    tasks: str = DiagnoseTasksOpt,
    limit: int = DiagnoseLimitOpt,
    text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt,
    out: Path = DiagnoseOutOpt,
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """δ_TCB paper Table 1: Pearson and Spearman Corr(δ, V_eff), Corr(δ, margin), Corr(margin, V_eff), all and low V_eff."""
    from promptopt.analyses.diagnose.workflows import run_regimes

    with progress.reporting("diagnose regimes", quiet=quiet):
        lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
        report = run_regimes(lm, spec, out, low_v_eff=low_v_eff, progress=progress.bars())
    print_regimes(report, lm.name, low_v_eff)


@diagnose_app.command("approx", rich_help_panel=DIAGNOSE_MODEL)
def diagnose_approx(
    tasks: str = DiagnoseTasksOpt,
    limit: int = DiagnoseLimitOpt,
    text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt,
    out: Path = DiagnoseOutOpt,
    model: str = ModelOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """The statistical approximation and its V_eff limit vs exact δ_TCB: ratio distribution per V_eff band."""
    from promptopt.analyses.diagnose.workflows import run_approx

    with progress.reporting("diagnose approx", quiet=quiet):
        lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
        report = run_approx(lm, spec, out, progress=progress.bars())
    print_approx(report, lm.name)


@diagnose_app.command("taboo", rich_help_panel=DIAGNOSE_MODEL)
def diagnose_taboo(
    task: str = typer.Option(
        "triviaqa", "--task", help="a generative task (gsm8k is the paper's main one; slow on CPU)"
    ),
    prompt: Path | None = CardOpt,
    ranks: str = typer.Option("1,2,4,8", "--ranks", help="taboo ranks of the greedy dose sweep"),
    mid_word_ranks: str = typer.Option(
        "2", "--mid-word-ranks", help="ranks where mid-word and word-initial are compared ('' = skip)"
    ),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="sampled runs' τ (0 = skip them)"),
    seeds: int = typer.Option(3, "--seeds", min=0, help="sampled runs: seeds 0..N-1"),
    sampled_ranks: str = typer.Option("1", "--sampled-ranks", help="ranks of the sampled runs"),
    split: str = typer.Option("test", "--split"),
    limit: int | None = typer.Option(
        16, "--limit", min=1, help="items (one generation batch at the default batch size)"
    ),
    out: Path = DiagnoseOutOpt,
    model: str = ModelOpt,
    subsets: str | None = SubsetsOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Taboo paper: ΔS per intervention vs rank (a + b·ln i, R²), mid-word vs word-initial, temperature seeds."""
    from promptopt.analyses.diagnose.workflows import run_taboo

    rank_list = int_list(ranks, "--ranks")
    mid_list = int_list(mid_word_ranks, "--mid-word-ranks", allow_empty=True)
    sampled_list = int_list(sampled_ranks, "--sampled-ranks")
    the_session = session(task, model, device, dtype, quantize, subsets, trust_task_code=trust_task_code)
    with progress.reporting("diagnose taboo", quiet=quiet):
        report = run_taboo(
            the_session,
            out,
            split=split,
            limit=limit,
            card=prompt,
            ranks=rank_list,
            mid_word_ranks=mid_list,
            temperature=temperature,
            seeds=tuple(range(seeds)),
            sampled_ranks=sampled_list,
        )
    print_taboo_sweep(report, the_session.data.spec.name, temperature)


@diagnose_app.command("conflicts", rich_help_panel=DIAGNOSE_MODEL)
def diagnose_conflicts(
    task: str = typer.Option("sst2", "--task", help="built-in task name, task YAML or lmeval:NAME"),
    prompt: Path | None = CardOpt,
    seeds: int = typer.Option(
        3, "--seeds", help="baseline prompts (exemplars redrawn from the pool per seed) for VCQ / AQ; at least 2"
    ),
    seed: int = typer.Option(0, "--seed", help="seeds the exemplar redraws and the search's sampler"),
    limit: int | None = typer.Option(12, "--limit", min=1, help="dev items and test items (each) to characterise"),
    trials: int = typer.Option(5, "--trials", help="finished trials of the targeted search on the AQ dev items"),
    strategy: str = typer.Option("tcb", "--strategy", help="search strategy (docs/search.md#strategies)"),
    suite: str = typer.Option("quick", "--suite", help="perturbation suite for Table 3's perturbed columns"),
    confidence: str = typer.Option(
        "top_prob", "--confidence", help="confidence signal of the classes: top_prob (P(top1)), margin or v_eff"
    ),
    log_tcb_low: float | None = typer.Option(
        None, "--log-tcb-low", help="L on log10 δ_TCB (default: its 25th percentile over the items)"
    ),
    log_tcb_high: float | None = typer.Option(
        None, "--log-tcb-high", help="H on log10 δ_TCB (default: 75th percentile)"
    ),
    conf_low: float | None = typer.Option(
        None, "--conf-low", help="C_L on the confidence signal (default: 25th percentile)"
    ),
    conf_high: float | None = typer.Option(
        None, "--conf-high", help="C_H on the confidence signal (default: 75th percentile)"
    ),
    t_low: float | None = typer.Option(
        None, "--t-low", help="T_L on mean log10 δ_TCB (default: 25th percentile over dev questions)"
    ),
    t_high: float | None = typer.Option(
        None, "--t-high", help="T_H on mean log10 δ_TCB (default: median over dev questions)"
    ),
    v_low: float | None = typer.Option(
        None, "--v-low", help="V_L on the log10 δ_TCB variance (default: its 75th percentile over dev questions, = V_H)"
    ),
    v_high: float | None = typer.Option(
        None, "--v-high", help="V_H on the log10 δ_TCB variance (default: 75th percentile)"
    ),
    out: Path = DiagnoseOutOpt,
    model: str = ModelOpt,
    subsets: str | None = SubsetsOpt,
    batch_size: str = BatchOpt,
    device: str = DeviceOpt,
    dtype: str | None = DtypeOpt,
    quantize: str | None = QuantizeOpt,
    trust_task_code: bool = TrustTaskCodeOpt,
    quiet: bool = QuietOpt,
) -> None:
    """δ_TCB paper §4.3 / Table 3: accuracy–stability conflict classes, VCQ / AQ over seeds, a search on the AQ dev
    items, and baseline vs enhanced prompt on the held-out AQ and VCQ test items."""
    from promptopt.analyses.diagnose.workflows import run_conflicts

    the_session = session(
        task, model, device, dtype, quantize, subsets, batch_size, out=out, trust_task_code=trust_task_code
    )
    with progress.reporting("diagnose conflicts", quiet=quiet):
        report = run_conflicts(
            the_session,
            out,
            limit=limit,
            seeds=seeds,
            seed=seed,
            card=prompt,
            strategy=strategy,
            trials=trials,
            suite=suite,
            confidence=confidence,
            progress=progress.bars(),
            class_thresholds=_given(
                log_tcb_low=log_tcb_low, log_tcb_high=log_tcb_high, conf_low=conf_low, conf_high=conf_high
            ),
            set_thresholds=_given(t_low=t_low, t_high=t_high, v_low=v_low, v_high=v_high),
        )
    print_conflicts(report.result, the_session.data.spec.name, the_session.lm.name)
    console.print(f"{report.seconds:.1f} s; wrote " + ", ".join(str(p) for p in report.written))


@diagnose_app.command("risk-coverage", rich_help_panel=DIAGNOSE_RUN)
def diagnose_risk_coverage(
    run_dirs: list[Path] = typer.Argument(
        ..., help="compare directories (or robustness_items.parquet files), one per task: their winners' test answers"
    ),
    split: str = typer.Option("unseen", "--split", help="the families whose variants count as flips: unseen or seen"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
    out: Path | None = typer.Option(
        None, "--out", help="folder for risk_coverage.csv and risk_coverage.png (default: the first run directory)"
    ),
) -> None:
    """Risk–coverage of δ_TCB, margin, max probability and entropy: the flip rate and accuracy of the answers kept
    when the most fragile ones are flagged, at coverage 100/90/80/70%, with bootstrap intervals over items."""
    from promptopt.analyses.risk_coverage import diagnose_risk_coverage as run_risk
    from promptopt.cli.render_robustness import print_risk_coverage

    table, written = run_risk(run_dirs, out=out, split=split, seed=seed)
    print_risk_coverage(table)
    console.print("wrote " + ", ".join(str(p) for p in written))
