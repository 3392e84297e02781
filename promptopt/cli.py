"""The `promptopt` command line: a thin shell that parses, calls the library and prints.

User mistakes (UserError) end in one line on stderr and exit status 2; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from promptopt.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Find prompts that are accurate and stable.")
console = Console() if sys.stdout.isatty() else Console(width=200)  # pipes and files get whole tables

ModelOpt = typer.Option("smollm2-135m-instruct", "--model", help="hub id, local HF folder, .gguf file, or an embedded model: smollm2-135m-instruct, gemma3-270m")
DeviceOpt = typer.Option("auto", "--device", help="cpu, cuda, cuda:N or auto")
DtypeOpt = typer.Option(None, "--dtype", help="float32, bfloat16, float16 (default: float32 on CPU, bf16 on GPU)")
QuantizeOpt = typer.Option(None, "--quantize", help="4bit or 8bit through bitsandbytes (CUDA only)")
TaskOpt = typer.Option(..., "--task", help="built-in task name or path to a task YAML")
CardOpt = typer.Option(None, "--prompt", help="prompt card (YAML); default: the task's own prompt")
SubsetsOpt = typer.Option(None, "--subsets", help="comma-separated subsets (e.g. MMLU subjects), or 'all'")
BatchOpt = typer.Option(16, "--batch-size", min=1)
# search and compare share these
StorageOpt = typer.Option(None, "--storage", envvar="PROMPTOPT_STORAGE", show_envvar=True,
                          help="Optuna storage URL (default: SQLite in --out); a URL with a password is best given in $PROMPTOPT_STORAGE (or PGPASSWORD / ~/.pgpass), and is never written with its password")
SeedOpt = typer.Option(1234, "--seed")
SpaceOpt = typer.Option(None, "--space", help="search space YAML (default: the task's built-in space)")
ResumeOpt = typer.Option(False, "--resume", help="continue (or join) an existing study")
WorkersOpt = typer.Option(1, "--n-workers", help="worker processes sharing the study")
MinibatchOpt = typer.Option(16, "--minibatch", help="dev items per pruning step")
PruningOpt = typer.Option(True, "--pruning/--no-pruning", help="Wilcoxon paired pruning on dev items")
DevLimitOpt = typer.Option(None, "--dev-limit", min=1, help="use only the first N dev items")
TestLimitOpt = typer.Option(None, "--test-limit", min=1, help="use only the first N test items")


def _quiet_libraries() -> None:
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import huggingface_hub

    huggingface_hub.utils.logging.set_verbosity_error()


def _fmt(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if math.isinf(value):
            return "inf"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))[:40]
    text = str(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def _print_frame(frame, columns: list[str], title: str, max_rows: int) -> None:
    table = Table(title=title, show_lines=False)
    shown = [c for c in columns if c in frame.columns]
    for name in shown:
        table.add_column(name, justify="right" if frame[name].dtype.kind in "fiu" else "left")
    for _, row in frame.head(max_rows).iterrows():
        table.add_row(*(_fmt(row[c]) for c in shown))
    console.print(table)
    if len(frame) > max_rows:
        console.print(f"... {len(frame) - max_rows} more rows")


def _print_summary(summary: dict, title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, _fmt(value) if not isinstance(value, list) else "[" + ", ".join(_fmt(v) for v in value) + "]")
    console.print(table)


def _check_out_files(*paths: Optional[Path]) -> None:
    """Output files are checked before any scoring, so a bad --out never costs a finished computation."""
    from promptopt.yamlio import check_output

    for path in paths:
        if path is not None:
            check_output(path, folder=False, what="--out")


def _subsets(subsets: Optional[str]):
    return tuple(x.strip() for x in subsets.split(",") if x.strip()) if subsets else None


def _session(task: str, model: str, device: str, dtype, quantize, subsets, batch_size: int = 16, out=None):
    """The experiment session every command starts from (task checked now, model loaded on first use)."""
    from promptopt.experiments import Session
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig

    return Session(model=ModelConfig(spec=model, device=device, dtype=dtype, quantize=quantize),
                   data=DataConfig(task=task, subsets=_subsets(subsets)), out=out, batch_size=batch_size, progress=True)


@app.command()
def score(
    task: str = TaskOpt,
    prompt: Optional[Path] = CardOpt,
    model: str = ModelOpt,
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="score only the first N items of the split"),
    split: str = typer.Option("test", "--split", help="pool, dev or test"),
    subsets: Optional[str] = SubsetsOpt,
    batch_size: int = BatchOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="write the per-item table (.parquet or .csv) and a .json summary"),
    rows: int = typer.Option(20, "--rows", min=0, help="how many item rows to print"),
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
    quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Score a prompt on a task: per-item correctness, δ_TCB, V_eff, margin and PPL, then a summary."""
    _quiet_libraries()
    if out is not None and out.suffix not in (".parquet", ".csv"):
        raise UserError(f"--out {out}: use a .parquet or .csv file name")
    _check_out_files(out, out.with_suffix(".json") if out else None)
    session = _session(task, model, device, dtype, quantize, subsets, batch_size)
    the_prompt, data = session.prompt(prompt), session.data
    scorer = session.scorer
    result = scorer.score(the_prompt, data.split(split)[:limit])
    columns = ["item_id", "correct", "pred", "gold", "tcb", "v_eff", "margin", "target_nll", "ppl"]
    _print_frame(result.table, columns, f"{data.spec.name} · {split} · {scorer.lm.name}", rows)
    _print_summary(result.summary, "summary")
    if out is not None:
        from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text

        table = result.table.copy()
        table["gold"] = table["gold"].astype(str)
        writer = (lambda p: table.to_parquet(p, index=False)) if out.suffix == ".parquet" else (lambda p: table.to_csv(p, index=False))
        atomic_write_bytes_via(out, writer)
        atomic_write_text(out.with_suffix(".json"), json.dumps(result.summary, indent=1))
        console.print(f"wrote {out} and {out.with_suffix('.json')}")


@app.command()
def trace(
    text: str = typer.Argument(..., help="the prompt to continue"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", min=1),
    model: str = ModelOpt,
    chat: Optional[bool] = typer.Option(None, "--chat/--plain", help="wrap TEXT in the chat template (default: if the model has one)"),
    dip_ratio: float = typer.Option(0.5, "--dip-ratio", help="flag a token whose δ_TCB falls below this fraction of the running median"),
    window: int = typer.Option(8, "--window", min=2, help="tokens in the running median"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the per-token table (.parquet or .csv)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write the paper's Fig. 4 panels (.png or .svg)"),
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
) -> None:
    """Generate greedily and print δ_TCB, V_eff, margin, P(2nd best), −log p and running PPL of every token, flagging δ_TCB dips."""
    from promptopt.trace import plot_trace, trace_generation

    _quiet_libraries()
    if out is not None and out.suffix not in (".parquet", ".csv"):
        raise UserError(f"--out {out}: use a .parquet or .csv file name")
    if plot is not None and plot.suffix not in (".png", ".svg"):
        raise UserError(f"--plot {plot}: use a .png or .svg file name")
    from promptopt.models import load_model

    lm = load_model(model, device=device, dtype=dtype)
    frame = trace_generation(lm, text, max_new_tokens=max_new_tokens, chat=chat, dip_ratio=dip_ratio, window=window)
    table = Table(title=f"trace · {lm.name}")
    for name in ("step", "token", "tcb", "v_eff", "margin", "p_second", "nll", "running_ppl", "dip"):
        table.add_column(name, justify="left" if name in ("token", "dip") else "right")
    for _, row in frame.iterrows():
        table.add_row(str(row.step), repr(row.token), _fmt(row.tcb), _fmt(row.v_eff), _fmt(row.margin), _fmt(row.p_second),
                      _fmt(row.nll), _fmt(row.running_ppl), "▼ dip" if row.dip else "")
    console.print(table)
    console.print(f"{int(frame['dip'].sum())} dip(s) in {len(frame)} tokens; text: {''.join(frame['token'])!r}")
    if out is not None:
        from promptopt.yamlio import atomic_write_bytes_via

        writer = (lambda p: frame.to_parquet(p, index=False)) if out.suffix == ".parquet" else (lambda p: frame.to_csv(p, index=False))
        atomic_write_bytes_via(out, writer)
        console.print(f"wrote {out}")
    if plot is not None:
        plot_trace(frame, plot, title=f"{lm.name}: {text[:60]}")
        console.print(f"wrote {plot}")


def _search_config(**flat):
    from promptopt.search import SearchConfig

    flat["subsets"] = _subsets(flat.get("subsets"))
    return SearchConfig.build(**flat)


def _print_search_result(result) -> None:
    from promptopt.search.study import dashboard_command

    best = result.best_params
    console.print(
        f"best trial #{result.best_number}: instruction={best.get('instruction')!r} template={best.get('template')!r} "
        f"k={best.get('k')} exemplars={[ex.id for ex in result.prompt.exemplars]}"
    )
    rows = []
    for split, summary in (("dev", result.dev), ("test", result.test)):
        rows.append({"split": split, "n": summary["n"], "accuracy": summary["accuracy"], "tcb_mean": summary.get("tcb_mean"),
                     "tcb_geomean": summary.get("tcb_geomean"), "ppl_mean": summary["ppl_mean"]})
    import pandas as pd

    _print_frame(pd.DataFrame(rows), list(rows[0]), "best prompt", 5)
    if result.pareto is not None:
        _print_frame(result.pareto[["number", "accuracy", "signed_stability", "instruction", "template", "k"]], ["number", "accuracy", "signed_stability", "instruction", "template", "k"], "Pareto front", 20)
    states = result.trials["state"].value_counts().to_dict()
    console.print(f"trials: {states}; wall {result.wall_seconds:.1f}s; cache hit rate {result.cache_hit_rate:.2f}")
    console.print(f"wrote {result.card_path} and the trials table in {result.card_path.parent}")
    console.print(f"dashboard: {dashboard_command(result.config)}")


@app.command()
def search(
    task: str = TaskOpt,
    strategy: str = typer.Option("tcb", "--strategy", help="tcb, ppl, accuracy, pareto, acc_tcb, acc_ppl or ppl_solution (README: Search)"),
    trials: int = typer.Option(20, "--trials", help="finished (complete or pruned) trials to reach"),
    model: str = ModelOpt,
    storage: Optional[str] = StorageOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(Path("runs/search"), "--out", help="run directory"),
    space: Optional[str] = SpaceOpt,
    study_name: Optional[str] = typer.Option(None, "--study-name", help="default: <task>-<strategy>"),
    resume: bool = ResumeOpt,
    n_workers: int = WorkersOpt,
    minibatch: int = MinibatchOpt,
    pruning: bool = PruningOpt,
    dev_limit: Optional[int] = DevLimitOpt,
    test_limit: Optional[int] = TestLimitOpt,
    subsets: Optional[str] = SubsetsOpt,
    batch_size: int = BatchOpt,
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
    quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Search instructions × exemplar sets × orders × templates with Optuna; write the best prompt card."""
    from promptopt.search import run_search

    _quiet_libraries()
    config = _search_config(
        task=task, strategy=strategy, trials=trials, model=model, storage=storage, seed=seed, out=str(out), space=space,
        study_name=study_name, resume=resume, n_workers=n_workers, minibatch=minibatch, pruning=pruning,
        dev_limit=dev_limit, test_limit=test_limit, subsets=subsets, batch_size=batch_size, device=device, dtype=dtype,
        quantize=quantize,
    )
    expand = None
    if config.study.strategy == "robust":
        from promptopt.robustness import VariantExpander

        expand = VariantExpander("cheap")
    _print_search_result(run_search(config, expand=expand))


@app.command()
def compare(
    task: str = TaskOpt,
    trials: int = typer.Option(20, "--trials", help="the same budget for every strategy"),
    strategies: str = typer.Option("ppl,tcb,accuracy", "--strategies", help="comma-separated strategies"),
    model: str = ModelOpt,
    storage: Optional[str] = StorageOpt,
    seed: int = SeedOpt,
    out: Path = typer.Option(Path("runs/compare"), "--out", help="run directory"),
    space: Optional[str] = SpaceOpt,
    resume: bool = ResumeOpt,
    n_workers: int = WorkersOpt,
    minibatch: int = MinibatchOpt,
    pruning: bool = PruningOpt,
    dev_limit: Optional[int] = DevLimitOpt,
    test_limit: Optional[int] = TestLimitOpt,
    subsets: Optional[str] = SubsetsOpt,
    batch_size: int = BatchOpt,
    suite: str = typer.Option("default", "--suite", help="perturbation suite for the robustness columns, or 'none'"),
    robust_limit: Optional[int] = typer.Option(None, "--robust-limit", min=1, help="test items used for robustness (default: all)"),
    seeds: int = typer.Option(1, "--seeds", min=1, help="searches per strategy (sampler seed and exemplar candidates vary)"),
    top_n: int = typer.Option(3, "--top-n", min=1, help="distinct top trials of each search scored on test items and stressed"),
    select: str = typer.Option("strategy", "--select", help="strategy: each strategy's own winner; robust: best dev Acc_worst among the top-N inside the best dev accuracy's interval"),
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
    quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Run several strategies with the same budget and items; compare their winners on held-out test items
    with intervals and paired tests."""
    from promptopt.experiments import run_compare

    _quiet_libraries()
    base = _search_config(
        task=task, strategy="tcb", trials=trials, model=model, storage=storage, seed=seed, out=str(out), space=space,
        resume=resume, n_workers=n_workers, minibatch=minibatch, pruning=pruning, dev_limit=dev_limit,
        test_limit=test_limit, subsets=subsets, batch_size=batch_size, device=device, dtype=dtype, quantize=quantize,
    )
    result = run_compare(base, [s.strip() for s in strategies.split(",") if s.strip()], seeds=seeds, top_n=top_n,
                         select=select, suite=None if suite == "none" else suite, robust_limit=robust_limit)
    _print_compare(result, task, model)
    console.print(f"wrote {out / 'compare.csv'}, compare_runs.csv, compare_paired.csv, summary.json and one run directory per strategy under {out}")


def _pm(value, sd) -> str:
    return _fmt(value) if sd is None or sd != sd else f"{_fmt(value)} ± {_fmt(sd)}"


def _ci(low, high) -> str:
    return "—" if low != low else f"[{low:.3f}, {high:.3f}]"


def _print_compare(result, task: str, model: str) -> None:
    table = Table(title=f"compare · {task} · {result.summary['n_test']} test items · {model} · seeds {result.summary['seeds']}")
    for name in ("strategy", "Acc", "Acc 95% CI", "δ_TCB", "PPL", "AccVar_pert", "PDR", "Acc_worst", "Acc_worst 95% CI", "taboo R(i=1)", "wall s"):
        table.add_column(name, justify="left" if name == "strategy" else "right")
    for _, r in result.table.iterrows():
        table.add_row(r.strategy, _pm(r.avg_acc, r.avg_acc_sd), _ci(r.acc_ci_low, r.acc_ci_high), _pm(r.avg_tcb, r.avg_tcb_sd),
                      _pm(r.avg_ppl, r.avg_ppl_sd), _fmt(r.acc_var_pert), _pm(r.pdr, r.pdr_sd), _pm(r.acc_worst, r.acc_worst_sd),
                      _ci(r.get("acc_worst_ci_low", float("nan")), r.get("acc_worst_ci_high", float("nan"))),
                      _fmt(r.taboo_retention_i1), _fmt(r.wall_seconds))
    console.print(table)
    paired = Table(title="paired on the same test items (a − b): 95% paired-bootstrap intervals, exact McNemar; * = significant at 0.05")
    for name in ("a", "b", "Δ Acc", "95% CI", "McNemar p", "Δ Acc_worst", "95% CI ", "Δ PDR", "95% CI  "):
        paired.add_column(name, justify="left" if name in ("a", "b") else "right")
    for _, r in result.paired.iterrows():
        paired.add_row(r.a, r.b, f"{r.delta_acc:+.3f}{' *' if r.significant else ''}", _ci(r.delta_acc_ci_low, r.delta_acc_ci_high),
                       f"{r.mcnemar_p:.3g}", _fmt(r.get("delta_acc_worst", float("nan"))),
                       _ci(r.get("delta_acc_worst_ci_low", float("nan")), r.get("delta_acc_worst_ci_high", float("nan"))),
                       _fmt(r.get("delta_pdr", float("nan"))), _ci(r.get("delta_pdr_ci_low", float("nan")), r.get("delta_pdr_ci_high", float("nan"))))
    console.print(paired)
    for _, r in result.table.iterrows():
        if r.strategy != "baseline":
            console.print(f"{r.strategy}: {r.selected_by}")
    s = result.summary
    reuse = (f"reuse: {s['evaluations']} distinct prompts evaluated, {s['evaluations_reused']} shared with another search; "
             f"result cache hit rate {_fmt(s['result_cache_hit_rate'])}")
    if s.get("variant_embedding_hit_rate") is not None:
        reuse += f"; variant embeddings reused {_fmt(s['variant_embedding_hit_rate'])}"
    if s.get("paraphrase_memo_hits") or s.get("paraphrase_memo_misses"):
        reuse += f"; LM paraphrases reused {s['paraphrase_memo_hits']}, generated {s['paraphrase_memo_misses']}"
    console.print(reuse)


@app.command()
def evaluate(
    task: str = TaskOpt,
    prompt: Optional[Path] = CardOpt,
    suite: str = typer.Option("default", "--suite", help="built-in suite name (default, quick) or a suite YAML"),
    model: str = ModelOpt,
    split: str = typer.Option("test", "--split", help="dev or test"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="only the first N items"),
    out: Optional[Path] = typer.Option(None, "--out", help="write families (.csv) and a .json summary"),
    subsets: Optional[str] = SubsetsOpt,
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
    quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Robustness of a prompt under a perturbation suite: per-family accuracy, PDR, AccVar, Acc_worst."""
    from promptopt.robustness.suite import evaluate_robustness, load_suite

    _quiet_libraries()
    the_suite = load_suite(suite)
    _check_out_files(*((out.with_suffix(".csv"), out.with_suffix(".json")) if out else ()))
    session = _session(task, model, device, dtype, quantize, subsets)
    the_prompt, data = session.prompt(prompt), session.data
    result = evaluate_robustness(session.scorer, the_prompt, data.split(split)[:limit], the_suite, pool=data.pool, progress=True)
    columns = ["family", "n_variants", "dropped_not_applicable", "dropped_protection", "dropped_similarity",
               "acc_clean_same_items", "acc_perturbed", "pdr", "tcb_clean_mean", "tcb_perturbed_mean"]
    _print_frame(result.families, columns, f"robustness · {data.spec.name} · suite {the_suite.name}", 50)
    _print_summary(result.summary, "summary")
    if out is not None:
        from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text

        atomic_write_bytes_via(out.with_suffix(".csv"), lambda p: result.families.to_csv(p, index=False))
        atomic_write_text(out.with_suffix(".json"), json.dumps(result.summary, indent=1, default=str))


@app.command()
def stress(
    task: Optional[str] = typer.Option(None, "--task", help="a generative task (number, alias_match, multiple_choice_gen or code answers)"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="sweep: comma-separated generative tasks (with --models and --out)"),
    prompt: Optional[Path] = CardOpt,
    protocol: Optional[str] = typer.Option(None, "--protocol", help="a stress protocol: taboo-paper (the paper's 2-shot CoT, 512 tokens, Answer: lines) or a YAML path"),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="taboo ranks i (top-i masked); default 1,2,4,8 or the protocol's"),
    mid_word: bool = typer.Option(False, "--mid-word", help="ablation: mask only where the nominal token is mid-word"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy; > 0 samples with --seed"),
    seed: int = typer.Option(0, "--seed"),
    model: str = ModelOpt,
    models: Optional[str] = typer.Option(None, "--models", help="sweep: comma-separated models (hub ids, folders, .gguf, embedded names)"),
    split: Optional[str] = typer.Option(None, "--split", help="pool, dev or test (default test; a protocol names its own)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="the first N items (of the protocol's subsample, with --protocol)"),
    batch_size: int = BatchOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="one task: write the per-rank table (.csv) and per-item rows (.parquet); sweep: the sweep folder"),
    subsets: Optional[str] = SubsetsOpt,
    device: str = DeviceOpt,
    dtype: Optional[str] = DtypeOpt,
    quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Decoding-level taboo stress: retention (95% Wilson CI), injected surprisal and length expansion per rank;
    with --models/--tasks, the paper's sweep (Figures 1, 3 and 8), resumable."""
    from promptopt.robustness import taboo_stress
    from promptopt.robustness.protocol import load_protocol

    _quiet_libraries()
    the_protocol = load_protocol(protocol) if protocol else None
    rank_list = _int_list(ranks, "--ranks") if ranks else (the_protocol.ranks if the_protocol else (1, 2, 4, 8))
    mode = "mid_word" if mid_word else "word_initial"
    if the_protocol is not None and split is not None:
        raise UserError(f"--split: protocol {the_protocol.name} draws its items from its own split ({the_protocol.split}); drop --split")
    split = split or (the_protocol.split if the_protocol else "test")
    if tasks is not None or models is not None:
        _stress_sweep(tasks or task, models or model, the_protocol, rank_list, mode, temperature, seed, split,
                      limit, out, subsets, device, dtype, quantize, prompt, batch_size)
        return
    if task is None:
        raise UserError("stress: give --task (one task) or --tasks/--models (a sweep)")
    _check_out_files(*((out.with_suffix(".csv"), out.with_suffix(".parquet")) if out else ()))
    session = _session(task, model, device, dtype, quantize, subsets, batch_size)
    data = session.data
    if the_protocol is not None:
        data, the_prompt, items = the_protocol.apply(session.data_config, limit=limit)
        the_prompt = session.prompt(prompt) if prompt else the_prompt
        from promptopt.scoring import Scorer

        scorer = Scorer(session.lm, data, batch_size=batch_size, progress=True)
    else:
        the_prompt, items, scorer = session.prompt(prompt), data.split(split)[:limit], session.scorer
    result = taboo_stress(scorer, the_prompt, items, ranks=rank_list, mode=mode, temperature=temperature, seed=seed)
    columns = ["rank", "n", "accuracy", "retention", "retention_ci_low", "retention_ci_high", "marginal_retention",
               "mean_surprisal_per_intervention", "surprisal_total_per_item", "interventions_per_item", "length_expansion"]
    title = (f"taboo stress · {data.spec.name} · {'mid-word' if mid_word else 'word-initial'}"
             + (f" · protocol {the_protocol.name}" + (f" (prompt {prompt})" if prompt else "") if the_protocol else ""))
    _print_frame(result.summary, columns, title, 20)
    if out is not None:
        from promptopt.yamlio import atomic_write_bytes_via

        atomic_write_bytes_via(out.with_suffix(".csv"), lambda p: result.summary.to_csv(p, index=False))
        atomic_write_bytes_via(out.with_suffix(".parquet"), lambda p: result.items.to_parquet(p, index=False))


def _stress_sweep(tasks, models, the_protocol, rank_list, mode, temperature, seed, split, limit, out, subsets,
                  device, dtype, quantize, prompt, batch_size) -> None:
    from promptopt.experiments.stress_sweep import SweepSettings, retention_grid, run_stress_sweep
    from promptopt.models import ModelConfig
    from promptopt.yamlio import check_output

    if prompt is not None:
        raise UserError("--prompt: a sweep runs each task's own prompt, or the protocol's (--protocol); give one --task to stress a card")
    if out is None:
        raise UserError("a sweep (--models/--tasks) needs --out FOLDER: finished conditions are kept there, so a rerun resumes")
    if tasks is None:
        raise UserError("a sweep needs --tasks (comma-separated generative tasks)")
    check_output(out, folder=True, what="--out")
    task_list = [t.strip() for t in tasks.split(",") if t.strip()]
    model_list = [m.strip() for m in models.split(",") if m.strip()]
    probe = ModelConfig(spec=model_list[0] if model_list else "x", device=device, dtype=dtype, quantize=quantize)
    settings = SweepSettings(protocol=the_protocol.name if the_protocol else None,
                             protocol_sha256=the_protocol.digest if the_protocol else None, ranks=rank_list, mode=mode,
                             temperature=temperature, seed=seed, split=split, limit=limit, dtype=probe.resolved_dtype(),
                             device_type=probe.resolved_device_type(), quantize=quantize, batch_size=batch_size, subsets=_subsets(subsets))
    result = run_stress_sweep(models=model_list, tasks=task_list, settings=settings, out=out, protocol=the_protocol,
                              device=device, log=console.print)
    s = result.summary
    for task_name in task_list:
        grid = retention_grid(s, task_name)
        table = Table(title=f"Figure 1 · {task_name} · conditional retention, 95% Wilson interval ({mode}{', protocol ' + the_protocol.name if the_protocol else ''})")
        table.add_column("model")
        table.add_column("baseline acc", justify="right")
        for r in grid.columns:
            table.add_column(f"i={r}", justify="right")
        for model_name in grid.index:
            rows = s[(s["task"] == task_name) & (s["model"] == model_name)].set_index("rank")
            cells = [f"{rows.loc[r, 'retention']:.0%} {_ci(rows.loc[r, 'retention_ci_low'], rows.loc[r, 'retention_ci_high'])}"
                     if rows.loc[r, "n_base_correct"] else "— (no baseline-correct item)" for r in grid.columns]
            table.add_row(str(model_name), f"{rows.loc[0, 'accuracy']:.3f} (n={int(rows.loc[0, 'n'])})", *cells)
        console.print(table)
    console.print(f"{result.decoded} condition(s) decoded, {result.reused} reused from {out}; {result.seconds:.1f} s; wrote "
                  + ", ".join(str(p) for p in result.written))


diagnose_app = typer.Typer(no_args_is_help=True, help="Analyses of a run or a model (see README: Diagnose).")
app.add_typer(diagnose_app, name="diagnose")


@diagnose_app.command("proxy")
def diagnose_proxy(
    run_dirs: list[Path] = typer.Argument(..., help="search run directories of one task and model (e.g. every strategy/seed folder of a compare run); their trials are pooled"),
    trials: int = typer.Option(8, "--trials", min=3, help="distinct prompts (spread over each study's values) to stress"),
    limit: Optional[int] = typer.Option(40, "--limit", min=1, help="dev items per prompt"),
    suite: str = typer.Option("quick", "--suite", help="perturbation suite that measures robustness"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder for proxy_prompts.csv and proxy_correlations.csv (default: the run directory, or the runs' common parent)"),
) -> None:
    """Is δ_TCB a good proxy for robustness here? Spearman ρ of cheap signals vs measured Acc_worst and PDR."""
    from promptopt.experiments.proxy import proxy_correlations

    _quiet_libraries()
    if out is not None:
        from promptopt.yamlio import check_output

        check_output(out, folder=True, what="--out")
    result = proxy_correlations(run_dirs, n_trials=trials, limit=limit, suite=suite, seed=seed, out=out)
    _print_frame(result.prompts, list(result.prompts.columns), f"proxy · {len(run_dirs)} run(s) · prompts", 50)
    table = Table(title="Spearman ρ across prompts, 95% bootstrap interval over prompts (* = excludes 0)")
    for name in ("signal", "target", "n", "ρ", "95% CI"):
        table.add_column(name, justify="left" if name in ("signal", "target") else "right")
    for _, r in result.correlations.iterrows():
        table.add_row(r.signal, r.target, str(r.n_prompts), f"{r.spearman:+.3f}{' *' if r.interval_excludes_0 else ''}", _ci(r.ci_low, r.ci_high))
    console.print(table)
    console.print(f"wrote {result.folder / 'proxy_prompts.csv'} and {result.folder / 'proxy_correlations.csv'}")


DiagnoseOutOpt = typer.Option(Path("runs/diagnose"), "--out", help="folder for tables (Parquet + CSV), figures and the position cache")
DiagnoseTasksOpt = typer.Option("sst2,arc_easy,arc_challenge,mmlu", "--tasks", help="log-likelihood tasks whose critical points (and question texts) give positions")
DiagnoseLimitOpt = typer.Option(40, "--limit", min=0, help="test items per task (critical points)")
DiagnoseTextOpt = typer.Option(24, "--text-per-task", min=0, help="positions inside each task's question texts")
DiagnoseTraceOpt = typer.Option(32, "--trace-tokens", min=0, help="generated tokens per trace prompt (0: no trace positions)")


def _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens):
    from promptopt.experiments.diagnose.positions import PositionSpec
    from promptopt.models import ModelConfig

    _quiet_libraries()
    spec = PositionSpec(tasks=tuple(t.strip() for t in tasks.split(",") if t.strip()), limit=limit,
                        text_per_task=text_per_task, trace_tokens=trace_tokens)
    return ModelConfig(spec=model, device=device, dtype=dtype).load(), spec


def _print_written(report) -> None:
    n = len(report.positions.frame) if report.positions is not None else None
    console.print(f"{'' if n is None else f'{n} positions; '}{report.seconds:.1f} s; wrote " + ", ".join(str(p) for p in report.written))


@diagnose_app.command("geometry")
def diagnose_geometry(
    k: int = typer.Option(10, "--k", min=1, help="competitors moved (the most probable tokens after the top-1)"),
    alpha: float = typer.Option(0.5, "--alpha", help="cluster: w_j + α (w_top − w_j)"),
    beta: float = typer.Option(0.5, "--beta", help="disperse: w_j − β (w_top − w_j)"),
    tasks: str = DiagnoseTasksOpt, limit: int = DiagnoseLimitOpt, text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt, out: Path = DiagnoseOutOpt, model: str = ModelOpt,
    device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
) -> None:
    """δ_TCB paper Table 2: share of positions with δ_cluster > δ_orig > δ_disperse (h and o fixed; and o recomputed)."""
    from promptopt.experiments.diagnose.workflows import run_geometry

    lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
    report = run_geometry(lm, spec, out, k=k, alpha=alpha, beta=beta, progress=True)
    s = report.result.summary
    table = Table(title=f"geometry sensitivity · {lm.name} · K={k}, α={alpha:g}, β={beta:g} (share with δ_cluster > δ_orig > δ_disperse, 95% Wilson)")
    for name in ("V_eff", "n", "h, o fixed (paper's)", "o recomputed", "median δ_cl/δ", "median δ_disp/δ", "paper"):
        table.add_column(name, justify="left" if name == "V_eff" else "right")
    for _, r in s.iterrows():
        table.add_row(r.band, str(r.n), f"{_fmt(r.held_fixed_o)} {_ci(r.ci_low_fixed_o, r.ci_high_fixed_o)}",
                      f"{_fmt(r.held_recomputed_o)} {_ci(r.ci_low_recomputed_o, r.ci_high_recomputed_o)}",
                      _fmt(r.median_cluster_ratio_fixed_o), _fmt(r.median_disperse_ratio_fixed_o), f"{r.paper_held:.0%}")
    console.print(table)
    drift = (report.result.positions["orig_vs_exact_form"] - 1).abs().max()
    console.print(f"δ_orig from (o, W) vs the exact form from h: max relative difference {drift:.1e}")
    _print_written(report)


@diagnose_app.command("regimes")
def diagnose_regimes(
    low_v_eff: float = typer.Option(2.0, "--low-veff", help="the low-V_eff subset: V_eff below this"),
    tasks: str = DiagnoseTasksOpt, limit: int = DiagnoseLimitOpt, text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt, out: Path = DiagnoseOutOpt, model: str = ModelOpt,
    device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
) -> None:
    """δ_TCB paper Table 1: Pearson and Spearman Corr(δ, V_eff), Corr(δ, margin), Corr(margin, V_eff), all and low V_eff."""
    from promptopt.experiments.diagnose.workflows import run_regimes

    lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
    report = run_regimes(lm, spec, out, low_v_eff=low_v_eff, progress=True)
    table = Table(title=f"regimes · {lm.name} · correlations with 95% Fisher-z intervals (paper: Pearson, Llama-3.1-8B)")
    for name in ("subset", "pair", "n", "Pearson", "Spearman", "Pearson (log δ, log V_eff)", "paper (DPD / LVD)"):
        table.add_column(name, justify="left" if name in ("subset", "pair") else "right")
    for _, r in report.result.table.iterrows():
        subset = {"all": "all", "low_v_eff": f"V_eff < {low_v_eff:g}", "high_v_eff": f"V_eff ≥ {low_v_eff:g}"}[r.subset]
        table.add_row(subset, r.pair, str(r.n), f"{r.pearson:+.2f} {_ci(r.pearson_ci_low, r.pearson_ci_high)}",
                      f"{r.spearman:+.2f} {_ci(r.spearman_ci_low, r.spearman_ci_high)}",
                      f"{r.pearson_log:+.2f} {_ci(r.pearson_log_ci_low, r.pearson_log_ci_high)}", f"{r.paper_pearson:+.2f}")
    console.print(table)
    if report.result.n_infinite:
        console.print(f"{report.result.n_infinite} position(s) with δ_TCB = +inf left out")
    _print_written(report)


@diagnose_app.command("approx")
def diagnose_approx(
    tasks: str = DiagnoseTasksOpt, limit: int = DiagnoseLimitOpt, text_per_task: int = DiagnoseTextOpt,
    trace_tokens: int = DiagnoseTraceOpt, out: Path = DiagnoseOutOpt, model: str = ModelOpt,
    device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt,
) -> None:
    """The statistical approximation and its V_eff limit vs exact δ_TCB: ratio distribution per V_eff band."""
    from promptopt.experiments.diagnose.workflows import run_approx

    lm, spec = _diagnose_inputs(model, device, dtype, tasks, limit, text_per_task, trace_tokens)
    report = run_approx(lm, spec, out, progress=True)
    table = Table(title=f"approximation / exact δ_TCB · {lm.name}")
    for name in ("V_eff", "approximation", "n", "median", "10–90%", "geomean", "within 2×", "Spearman vs exact", "expanded form off >0.1%"):
        table.add_column(name, justify="left" if name in ("V_eff", "approximation") else "right")
    for _, r in report.result.summary.iterrows():
        off = r.get("expanded_off_gt_0.1pct")
        table.add_row(r.band, r.approximation, str(r.n), _fmt(r.get("median_ratio", math.nan)),
                      _ci(r.get("q10", math.nan), r.get("q90", math.nan)), _fmt(r.get("geomean_ratio", math.nan)),
                      _fmt(r.get("within_2x", math.nan)), _fmt(r.get("spearman_vs_exact", math.nan)),
                      "" if off is None or off != off else str(int(off)))
    console.print(table)
    _print_written(report)


def _int_list(text: str, option: str, *, allow_empty: bool = False) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers") from None
    if (not values and not allow_empty) or any(v < 1 for v in values):
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers")
    return values


@diagnose_app.command("taboo")
def diagnose_taboo(
    task: str = typer.Option("triviaqa", "--task", help="a generative task (gsm8k is the paper's main one; slow on CPU)"),
    prompt: Optional[Path] = CardOpt,
    ranks: str = typer.Option("1,2,4,8", "--ranks", help="taboo ranks of the greedy dose sweep"),
    mid_word_ranks: str = typer.Option("2", "--mid-word-ranks", help="ranks where mid-word and word-initial are compared ('' = skip)"),
    temperature: float = typer.Option(0.7, "--temperature", min=0.0, help="sampled runs' τ (0 = skip them)"),
    seeds: int = typer.Option(3, "--seeds", min=0, help="sampled runs: seeds 0..N-1"),
    sampled_ranks: str = typer.Option("1", "--sampled-ranks", help="ranks of the sampled runs"),
    split: str = typer.Option("test", "--split"),
    limit: Optional[int] = typer.Option(16, "--limit", min=1, help="items (one generation batch at the default batch size)"),
    out: Path = DiagnoseOutOpt, model: str = ModelOpt, subsets: Optional[str] = SubsetsOpt,
    device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt, quantize: Optional[str] = QuantizeOpt,
) -> None:
    """Taboo paper: ΔS per intervention vs rank (a + b·ln i, R²), mid-word vs word-initial, temperature seeds."""
    from promptopt.experiments.diagnose.workflows import run_taboo

    _quiet_libraries()
    rank_list = _int_list(ranks, "--ranks")
    mid_list = _int_list(mid_word_ranks, "--mid-word-ranks", allow_empty=True)
    sampled_list = _int_list(sampled_ranks, "--sampled-ranks")
    session = _session(task, model, device, dtype, quantize, subsets)
    if not session.data.spec.generative:
        raise UserError(f"diagnose taboo needs a generative task (answer type number, alias_match or code); {task} is scored by log-likelihood")
    report = run_taboo(session, out, split=split, limit=limit, card=prompt, ranks=rank_list, mid_word_ranks=mid_list,
                       temperature=temperature, seeds=tuple(range(seeds)), sampled_ranks=sampled_list)
    sweep = report.result
    columns = ["rank", "n", "accuracy", "retention", "retention_ci_low", "retention_ci_high", "marginal_retention",
               "mean_surprisal_per_intervention", "interventions_per_item", "length_expansion"]
    _print_frame(sweep.dose, columns, f"taboo dose · {session.data.spec.name} · word-initial, greedy", 20)
    fit = sweep.fit
    console.print(f"mean ΔS per intervention ≈ {fit['a']:.3f} + {fit['b']:.3f}·ln i   (R² = {fit['r2']:.3f} over {fit['n']} ranks)")
    if not sweep.ablation.empty:
        _print_frame(sweep.ablation, ["rank", "mode", *columns[1:]], "word-initial vs mid-word at matched rank (greedy)", 20)
    if not sweep.sampled_summary.empty:
        _print_frame(sweep.sampled_summary, list(sweep.sampled_summary.columns), f"sampled, τ = {temperature:g}: mean and SD over seeds", 20)
    _print_written(report)


def _given(**values) -> dict:
    return {k: v for k, v in values.items() if v is not None}


@diagnose_app.command("conflicts")
def diagnose_conflicts(
    task: str = typer.Option("sst2", "--task", help="built-in task name or task YAML"),
    prompt: Optional[Path] = CardOpt,
    seeds: int = typer.Option(3, "--seeds", help="baseline prompts (exemplars redrawn from the pool per seed) for VCQ / AQ; at least 2"),
    seed: int = typer.Option(0, "--seed", help="seeds the exemplar redraws and the search's sampler"),
    limit: Optional[int] = typer.Option(12, "--limit", min=1, help="dev items and test items (each) to characterise"),
    trials: int = typer.Option(5, "--trials", help="finished trials of the targeted search on the AQ dev items"),
    strategy: str = typer.Option("tcb", "--strategy", help="search strategy (README: Search)"),
    suite: str = typer.Option("quick", "--suite", help="perturbation suite for Table 3's perturbed columns"),
    confidence: str = typer.Option("top_prob", "--confidence", help="confidence signal of the classes: top_prob (P(top1)), margin or v_eff"),
    log_tcb_low: Optional[float] = typer.Option(None, "--log-tcb-low", help="L on log10 δ_TCB (default: its 25th percentile over the items)"),
    log_tcb_high: Optional[float] = typer.Option(None, "--log-tcb-high", help="H on log10 δ_TCB (default: 75th percentile)"),
    conf_low: Optional[float] = typer.Option(None, "--conf-low", help="C_L on the confidence signal (default: 25th percentile)"),
    conf_high: Optional[float] = typer.Option(None, "--conf-high", help="C_H on the confidence signal (default: 75th percentile)"),
    t_low: Optional[float] = typer.Option(None, "--t-low", help="T_L on mean log10 δ_TCB (default: 25th percentile over dev questions)"),
    t_high: Optional[float] = typer.Option(None, "--t-high", help="T_H on mean log10 δ_TCB (default: median over dev questions)"),
    v_low: Optional[float] = typer.Option(None, "--v-low", help="V_L on the log10 δ_TCB variance (default: its 75th percentile over dev questions, = V_H)"),
    v_high: Optional[float] = typer.Option(None, "--v-high", help="V_H on the log10 δ_TCB variance (default: 75th percentile)"),
    out: Path = DiagnoseOutOpt, model: str = ModelOpt, subsets: Optional[str] = SubsetsOpt, batch_size: int = BatchOpt,
    device: str = DeviceOpt, dtype: Optional[str] = DtypeOpt, quantize: Optional[str] = QuantizeOpt,
) -> None:
    """δ_TCB paper §4.3 / Table 3: accuracy–stability conflict classes, VCQ / AQ over seeds, a search on the AQ dev
    items, and baseline vs enhanced prompt on the held-out AQ and VCQ test items."""
    from promptopt.experiments.diagnose.workflows import run_conflicts

    _quiet_libraries()
    _check_out_files(out / "conflicts_items.parquet")
    session = _session(task, model, device, dtype, quantize, subsets, batch_size, out=out)
    report = run_conflicts(session, out, limit=limit, seeds=seeds, seed=seed, card=prompt, strategy=strategy, trials=trials,
                           suite=suite, confidence=confidence, progress=True,
                           class_thresholds=_given(log_tcb_low=log_tcb_low, log_tcb_high=log_tcb_high, conf_low=conf_low, conf_high=conf_high),
                           set_thresholds=_given(t_low=t_low, t_high=t_high, v_low=v_low, v_high=v_high))
    _print_conflicts(report.result, session.data.spec.name, session.lm.name)
    console.print(f"{report.seconds:.1f} s; wrote " + ", ".join(str(p) for p in report.written))


def _print_conflicts(r, task: str, model: str) -> None:
    th = Table(title="thresholds (log δ = log10 δ_TCB)")
    for name in ("for", "threshold", "value", "δ_TCB", "how"):
        th.add_column(name, justify="right" if name in ("value", "δ_TCB") else "left")
    for _, row in _rows(r.class_thresholds.table().assign(used_for="classes"), r.set_thresholds.table().assign(used_for="VCQ / AQ")):
        th.add_row(row.used_for, row.threshold, _fmt(row.value), _fmt(row.tcb), row.how)
    console.print(th)
    table = Table(title=f"conflict classes · {task} · {model} · {int(r.classes['n_items'].iloc[0])} items (dev + test), "
                        f"confidence = {r.class_thresholds.confidence} · 95% Wilson")
    for name in ("class", "rule", "count", "share of items", "95% CI", "group", "share of group", "95% CI "):
        table.add_column(name, justify="left" if name in ("class", "rule", "group") else "right")
    for _, c in r.classes.iterrows():
        table.add_row(c["class"], c.rule, str(c["count"]), _fmt(c.share), _ci(c.ci_low, c.ci_high), f"{c.group} ({c.n_group})",
                      _fmt(c.share_of_group), _ci(c.group_ci_low, c.group_ci_high))
    console.print(table)
    hits = r.items[r.items["classes"] != ""]
    _print_frame(hits, ["item_id", "split", "correct", "tcb", "top_prob", "margin", "v_eff", "classes"], "items in a conflict class", 12)
    _print_frame(r.sets, ["split", "set", "n", "share", "seeds_acc_mean", "seeds_log_tcb_mean"],
                 f"VCQ / AQ over {int(r.questions['n_seeds'].max())} baseline seeds (seed scores chose these sets: in-selection numbers)", 10)
    s = r.search
    best = s.best_params
    console.print(f"enhanced prompt: trial #{s.best_number} of {s.config.name} ({s.config.study.strategy}, "
                  f"{len(s.trials)} trials on {s.dev['n']} AQ dev items): instruction={best.get('instruction')!r} "
                  f"template={best.get('template')!r} k={best.get('k')} exemplars={[ex.id for ex in s.prompt.exemplars]}")
    t3 = Table(title="Table 3 · ours: held-out test items (baseline = the prompt itself, not one of the seeds) · paper's rows: MMLU, GSM8K as printed")
    for name in ("source", "set", "prompt", "n", "Acc", "95% CI", "mean δ_TCB", "V_eff", "margin", "AccVar_pert", "PDR", "95% CI ", "Acc_worst", "95% CI  "):
        t3.add_column(name, justify="left" if name in ("source", "set", "prompt") else "right")
    for _, row in r.table3.iterrows():
        ours = row.source == "ours"
        t3.add_row(row.source, row.set, row.prompt, str(int(row.n)) if ours else "", _fmt(row.acc),
                   _ci(row.acc_ci_low, row.acc_ci_high) if ours else "", _fmt(row.tcb_mean), _fmt(row.v_eff_mean), _fmt(row.margin_mean),
                   _fmt(row.acc_var_pert), _fmt(row.pdr), _ci(row.pdr_ci_low, row.pdr_ci_high) if ours else "",
                   _fmt(row.acc_worst), _ci(row.acc_worst_ci_low, row.acc_worst_ci_high) if ours else "")
    console.print(t3)
    for note in r.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def _rows(*frames):
    for frame in frames:
        yield from frame.iterrows()


@app.command("model-folder")
def model_folder_command(model: str = ModelOpt) -> None:
    """Print the folder (or hub id) transformers loads the model from: use it to score a card with plain
    `AutoModelForCausalLM.from_pretrained` code (see examples/score_card_with_transformers.py)."""
    from promptopt.models.load import model_folder

    _quiet_libraries()
    print(model_folder(model))


@app.command()
def tasks() -> None:
    """List the built-in tasks."""
    from promptopt.tasks import builtin_task_names, load_task_spec

    for name in builtin_task_names():
        spec = load_task_spec(name)
        console.print(f"[bold]{name}[/bold] ({spec.answer_type}): {spec.description}")


@app.command("export")
def export_command(
    run_dir: Path = typer.Argument(..., help="a search run directory or a compare directory"),
    out: Path = typer.Option(..., "--out", help="the file to write (lm-eval: the task YAML; its items go beside it as .jsonl)"),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="compare directories: this strategy's winner (default: the best test accuracy)"),
    trial: Optional[int] = typer.Option(None, "--trial", help="this trial number instead of the winner"),
    fmt: str = typer.Option("card", "--format", help="card (YAML, version 2), messages (chat JSON), text, or lm-eval (task YAML)"),
    device: Optional[str] = typer.Option(None, "--device", help="override the run's device (fingerprints and the token-id hash need the model)"),
) -> None:
    """Export the winner (or a named trial) of a run as a prompt card that records everything its score depends on."""
    from promptopt.experiments.export import export_run

    _quiet_libraries()
    result = export_run(run_dir, out=out, strategy=strategy, trial=trial, fmt=fmt, device=device)
    test = result.card["metrics"]["test"]
    low, high = test["accuracy_ci95"]
    console.print(f"trial #{result.trial} of {result.card['search']['study']} ({result.card['search']['strategy']}): "
                  f"test accuracy {_fmt(test['accuracy'])} [{_fmt(low)}, {_fmt(high)}] on {test['n']} items")
    console.print("wrote " + ", ".join(str(p) for p in result.paths))


@app.command("verify")
def verify_command(
    card: Path = typer.Argument(..., help="a card written by `promptopt export`"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="re-score only the first N recorded test items"),
    model: Optional[str] = typer.Option(None, "--model", help="score with this model instead of the recorded one (its fingerprint difference fails the check)"),
    device: str = DeviceOpt,
) -> None:
    """Re-score a card on its recorded items with its recorded model; exit 1 with the differences if anything changed."""
    from promptopt.experiments.verify import verify_card

    _quiet_libraries()
    result = verify_card(card, limit=limit, model=model, device=device)
    for line in result.lines():
        console.print(line, markup=False, highlight=False)
    if not result.ok:
        raise typer.Exit(1)


@app.command("report")
def report_command(
    run_dir: Path = typer.Argument(..., help="a search run directory or a compare directory"),
    out: Optional[Path] = typer.Option(None, "--out", help="the HTML file (default: RUN_DIR/report.html)"),
    card: Optional[Path] = typer.Option(None, "--card", help="an exported card to show (default: the run's best card)"),
    robustness: Optional[list[Path]] = typer.Option(None, "--robustness", help="`evaluate --out` family tables (.csv) to plot; repeatable"),
    taboo: Optional[list[Path]] = typer.Option(None, "--taboo", help="`stress --out` rank tables (.csv) to plot; repeatable"),
) -> None:
    """Write one self-contained HTML report (opens offline): comparison, trials, Pareto fronts, robustness, the card."""
    from promptopt.experiments.report import write_report

    _quiet_libraries()
    path = write_report(run_dir, out=out, card=card, robustness=robustness or [], taboo=taboo or [])
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


def main() -> None:
    try:
        app()  # typer reports its own usage errors (exit 2); ours arrive as UserError
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line, never wrapped
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == 130:  # typer turns Ctrl-C into a silent exit 130
            print("interrupted", file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
