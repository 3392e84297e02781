"""All table printing: what the CLI shows of a result (the numbers come from the library)."""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console() if sys.stdout.isatty() else Console(width=200)  # pipes and files get whole tables


def fmt(value) -> str:
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


def print_frame(frame, columns: list[str], title: str, max_rows: int) -> None:
    """At most `max_rows` rows of `frame` as a table; none (no table, no header) for max_rows 0."""
    if max_rows <= 0:
        return
    table = Table(title=title, show_lines=False)
    shown = [c for c in columns if c in frame.columns]
    for name in shown:
        table.add_column(name, justify="right" if frame[name].dtype.kind in "fiu" else "left")
    for _, row in frame.head(max_rows).iterrows():
        table.add_row(*(fmt(row[c]) for c in shown))
    console.print(table)
    if len(frame) > max_rows:
        console.print(f"... {len(frame) - max_rows} more rows")


def print_summary(summary: dict, title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):  # names (families): plain text
            shown = ", ".join(value) or "(none)"
        else:
            shown = fmt(value) if not isinstance(value, list) else "[" + ", ".join(fmt(v) for v in value) + "]"
        table.add_row(key, escape(shown))
    console.print(table)


def pm(value, sd) -> str:
    """'0.8 ± 0.05'; a spread that is float residue of equal values (|sd| ≤ 1e-12 of the value) prints as 0."""
    if sd is None or sd != sd:
        return fmt(value)
    if isinstance(value, float) and math.isfinite(value) and abs(sd) <= 1e-12 * max(1.0, abs(value)):
        sd = 0.0
    return f"{fmt(value)} ± {fmt(float(sd))}"


def name_column(table: Table, header: str, names) -> None:
    """A left column of names (strategies, pairs) that a wide table never cuts: two names that share a prefix
    (accuracy@batch-adaptive, accuracy@batch-adaptive+ens5) would both print as the same 'accuracy@batch-ad…'."""
    table.add_column(header, justify="left", no_wrap=True, min_width=max([len(header), *(len(str(n)) for n in names)]))


def ci(low, high) -> str:
    return "—" if low != low else f"[{low:.3f}, {high:.3f}]"


def print_search_result(result) -> None:
    from promptopt.study.storage import dashboard_command

    best = result.best_params
    text = result.prompt.instruction
    shown = text if len(text) <= 100 else text[:97] + "..."
    decision = f" decision={result.prompt.decision}" if result.prompt.decision != "argmax" else ""
    kept = result.incumbent is not None and result.incumbent.get("kept")
    what = f"kept the incumbent (trial #{result.best_number})" if kept else f"best trial #{result.best_number}"
    console.print(
        f"{what}: instruction {shown!r} ({best.get('instruction', best.get('incumbent'))}) "
        f"template={best.get('template')!r} k={best.get('k')} exemplars={[ex.id for ex in result.prompt.exemplars]}"
        f"{decision}",
        markup=False,
    )
    if result.scan is not None:
        console.print(f"scan: {result.scan['verdict']}: {result.scan['why']}", markup=False, highlight=False)
    if result.selection:  # the tie set, the tie-break's reason and the smallest difference the dev size detects
        console.print(f"chosen by: {result.selection}", markup=False, highlight=False)
    rows = []
    for split, summary in (("dev", result.dev), ("test", result.test)):
        rows.append(
            {
                "split": split,
                "n": summary["n"],
                "accuracy": summary["accuracy"],
                "95% CI": ci(*summary.get("accuracy_ci95", (math.nan, math.nan))),
                "tcb_geomean": summary.get("tcb_geomean"),
                "ppl_mean": summary["ppl_mean"],
            }
        )
    import pandas as pd

    print_frame(pd.DataFrame(rows), list(rows[0]), "best prompt", 5)
    if result.pareto is not None:
        print_frame(
            result.pareto[["number", "accuracy", "signed_stability", "instruction", "template", "k"]],
            ["number", "accuracy", "signed_stability", "instruction", "template", "k"],
            "Pareto front",
            20,
        )
    states = result.trials["state"].value_counts().to_dict()
    skipped = f"{result.duplicates_skipped} duplicate prompt{'' if result.duplicates_skipped == 1 else 's'} skipped (FAIL, not counted)"
    spent = result.dev_items_spent
    items = (
        f"; dev items scored {spent['trials']} (the scan scored {spent['scan_pairs']}, "
        f"{spent['scan_extra']} of them beyond its trials)"
        if spent
        else ""
    )
    console.print(
        f"trials: {states}; {skipped}; wall {result.wall_seconds:.1f}s; cache hit rate {result.cache_hit_rate:.2f}"
        f"{items}"
    )
    console.print(f"wrote {result.card_path} and the trials table in {result.card_path.parent}")
    console.print(f"dashboard: {dashboard_command(result.config)}")


def print_pairs(table, run_a, run_b) -> None:
    """a − b per strategy: accuracy (exact test and bootstrap, both clustered by item) and Acc_worst over all and unseen families."""

    def interval(row, key):
        if key not in row or row[key] != row[key]:
            return "-"
        return f"{row[key]:+.3f} [{row[key + '_ci_low']:+.3f}, {row[key + '_ci_high']:+.3f}]"

    console.print(f"a = {run_a}, b = {run_b}; pairs are (seed, test item); intervals: 95% paired bootstrap over items")
    for _, row in table.iterrows():
        console.print(
            f"{row['strategy']} ({row['seeds']} seeds, {int(row['n_pairs'])} pairs): dev accuracy {row['dev_accuracy_a']:.3f} vs "
            f"{row['dev_accuracy_b']:.3f}; test accuracy {row['accuracy_a']:.3f} vs {row['accuracy_b']:.3f}, "
            f"Δ {interval(row, 'delta_acc')}, {row.get('paired_test', 'exact McNemar')} p = {row['mcnemar_p']:.3g} "
            f"({int(row['only_a_correct'])} only a right, {int(row['only_b_correct'])} only b right)"
        )
        console.print(
            f"  Δ Acc_worst {interval(row, 'delta_acc_worst')}; unseen families {interval(row, 'delta_acc_worst_unseen')}; "
            f"Δ PDR {interval(row, 'delta_pdr')}"
        )


def print_written(report) -> None:
    n = len(report.positions.frame) if report.positions is not None else None
    console.print(
        f"{'' if n is None else f'{n} positions; '}{report.seconds:.1f} s; wrote "
        + ", ".join(str(p) for p in report.written)
    )


def print_conflicts(r, task: str, model: str) -> None:
    from promptopt.workflows.compare.records import ACCURACY_CI

    th = Table(title="thresholds (log δ = log10 δ_TCB)")
    for name in ("for", "threshold", "value", "δ_TCB", "how"):
        th.add_column(name, justify="right" if name in ("value", "δ_TCB") else "left")
    for _, row in iter_rows(
        r.class_thresholds.table().assign(used_for="classes"), r.set_thresholds.table().assign(used_for="VCQ / AQ")
    ):
        th.add_row(row.used_for, row.threshold, fmt(row.value), fmt(row.tcb), row.how)
    console.print(th)
    table = Table(
        title=f"conflict classes · {task} · {model} · {int(r.classes['n_items'].iloc[0])} items (dev + test), "
        f"confidence = {r.class_thresholds.confidence} · 95% Wilson"
    )
    for name in ("class", "rule", "count", "share of items", "95% CI", "group", "share of group", "95% CI "):
        table.add_column(name, justify="left" if name in ("class", "rule", "group") else "right")
    for _, c in r.classes.iterrows():
        table.add_row(
            c["class"],
            c.rule,
            str(c["count"]),
            fmt(c.share),
            ci(c.ci_low, c.ci_high),
            f"{c.group} ({c.n_group})",
            fmt(c.share_of_group),
            ci(c.group_ci_low, c.group_ci_high),
        )
    console.print(table)
    hits = r.items[r.items["classes"] != ""]
    print_frame(
        hits,
        ["item_id", "split", "correct", "tcb", "top_prob", "margin", "v_eff", "classes"],
        "items in a conflict class",
        12,
    )
    print_frame(
        r.sets,
        ["split", "set", "n", "share", "seeds_acc_mean", "seeds_log_tcb_mean"],
        f"VCQ / AQ over {int(r.questions['n_seeds'].max())} baseline seeds (seed scores chose these sets: in-selection numbers)",
        10,
    )
    s = r.search
    best = s.best_params
    console.print(
        f"enhanced prompt: trial #{s.best_number} of {s.config.name} ({s.config.study.strategy}, "
        f"{len(s.trials)} trials on {s.dev['n']} AQ dev items): instruction={best.get('instruction')!r} "
        f"template={best.get('template')!r} k={best.get('k')} exemplars={[ex.id for ex in s.prompt.exemplars]}"
    )
    t3 = Table(
        title="Table 3 · ours: held-out test items (baseline = the prompt itself, not one of the seeds) · paper's rows: MMLU, GSM8K as printed"
    )
    for name in (
        "source",
        "set",
        "prompt",
        "n",
        "Acc",
        "95% CI",
        "mean δ_TCB",
        "V_eff",
        "margin",
        "AccVar_pert",
        "PDR",
        "95% CI ",
        "Acc_worst",
        "95% CI  ",
    ):
        t3.add_column(name, justify="left" if name in ("source", "set", "prompt") else "right")
    for _, row in r.table3.iterrows():
        ours = row.source == "ours"
        t3.add_row(
            row.source,
            row.set,
            row.prompt,
            str(int(row.n)) if ours else "",
            fmt(row.acc),
            ci(*(row[c] for c in ACCURACY_CI)) if ours else "",
            fmt(row.tcb_mean),
            fmt(row.v_eff_mean),
            fmt(row.margin_mean),
            fmt(row.acc_var_pert),
            fmt(row.pdr),
            ci(row.pdr_ci_low, row.pdr_ci_high) if ours else "",
            fmt(row.acc_worst),
            ci(row.acc_worst_ci_low, row.acc_worst_ci_high) if ours else "",
        )
    console.print(t3)
    for note in r.notes:
        console.print(f"note: {note}", markup=False, highlight=False)


def iter_rows(*frames):
    for frame in frames:
        yield from frame.iterrows()


def print_score(result, task: str, split: str, model: str, rows: int) -> None:
    columns = ["item_id", "correct", "pred", "gold", "tcb", "v_eff", "margin", "target_nll", "ppl"]
    print_frame(result.table, columns, f"{task} · {split} · {model}", rows)
    print_summary(result.summary, "summary")


def print_trace(frame, model: str) -> None:
    table = Table(title=f"trace · {model}")
    for name in ("step", "token", "tcb", "v_eff", "margin", "p_second", "nll", "running_ppl", "dip"):
        table.add_column(name, justify="left" if name in ("token", "dip") else "right")
    for _, row in frame.iterrows():
        table.add_row(
            str(row.step),
            repr(row.token),
            fmt(row.tcb),
            fmt(row.v_eff),
            fmt(row.margin),
            fmt(row.p_second),
            fmt(row.nll),
            fmt(row.running_ppl),
            "▼ dip" if row.dip else "",
        )
    console.print(table)
    console.print(f"{int(frame['dip'].sum())} dip(s) in {len(frame)} tokens; text: {''.join(frame['token'])!r}")


_TABOO_COLUMNS = [
    "rank",
    "n",
    "accuracy",
    "retention",
    "retention_ci_low",
    "retention_ci_high",
    "marginal_retention",
    "mean_surprisal_per_intervention",
]


def print_stress(summary, title: str) -> None:
    columns = [*_TABOO_COLUMNS, "surprisal_total_per_item", "interventions_per_item", "length_expansion"]
    print_frame(summary, columns, title, 20)


def print_stress_sweep(result, tasks: list[str], mode: str, protocol: str | None, out) -> None:
    from promptopt.analyses.stress_sweep import retention_grid

    s = result.summary
    for task_name in tasks:
        grid = retention_grid(s, task_name)
        table = Table(
            title=f"Figure 1 · {task_name} · conditional retention, 95% Wilson interval ({mode}{', protocol ' + protocol if protocol else ''})"
        )
        table.add_column("model")
        table.add_column("baseline acc", justify="right")
        for r in grid.columns:
            table.add_column(f"i={r}", justify="right")
        for model_name in grid.index:
            rows = s[(s["task"] == task_name) & (s["model"] == model_name)].set_index("rank")
            cells = [
                f"{rows.loc[r, 'retention']:.0%} {ci(rows.loc[r, 'retention_ci_low'], rows.loc[r, 'retention_ci_high'])}"
                if rows.loc[r, "n_base_correct"]
                else "— (no baseline-correct item)"
                for r in grid.columns
            ]
            table.add_row(str(model_name), f"{rows.loc[0, 'accuracy']:.3f} (n={int(rows.loc[0, 'n'])})", *cells)
        console.print(table)
    console.print(
        f"{result.decoded} condition(s) decoded, {result.reused} reused from {out}; {result.seconds:.1f} s; wrote "
        + ", ".join(str(p) for p in result.written)
    )


def print_geometry(report, model: str, k: int, alpha: float, beta: float) -> None:
    s = report.result.summary
    table = Table(
        title=f"geometry sensitivity · {model} · K={k}, α={alpha:g}, β={beta:g} (share with δ_cluster > δ_orig > δ_disperse, 95% Wilson)"
    )
    for name in ("V_eff", "n", "h, o fixed (paper's)", "o recomputed", "median δ_cl/δ", "median δ_disp/δ", "paper"):
        table.add_column(name, justify="left" if name == "V_eff" else "right")
    for _, r in s.iterrows():
        table.add_row(
            r.band,
            str(r.n),
            f"{fmt(r.held_fixed_o)} {ci(r.ci_low_fixed_o, r.ci_high_fixed_o)}",
            f"{fmt(r.held_recomputed_o)} {ci(r.ci_low_recomputed_o, r.ci_high_recomputed_o)}",
            fmt(r.median_cluster_ratio_fixed_o),
            fmt(r.median_disperse_ratio_fixed_o),
            f"{r.paper_held:.0%}",
        )
    console.print(table)
    drift = (report.result.positions["orig_vs_exact_form"] - 1).abs().max()
    console.print(f"δ_orig from (o, W) vs the exact form from h: max relative difference {drift:.1e}")
    print_written(report)


def print_regimes(report, model: str, low_v_eff: float) -> None:
    table = Table(title=f"regimes · {model} · correlations with 95% Fisher-z intervals (paper: Pearson, Llama-3.1-8B)")
    for name in ("subset", "pair", "n", "Pearson", "Spearman", "Pearson (log δ, log V_eff)", "paper (DPD / LVD)"):
        table.add_column(name, justify="left" if name in ("subset", "pair") else "right")
    for _, r in report.result.table.iterrows():
        subset = {"all": "all", "low_v_eff": f"V_eff < {low_v_eff:g}", "high_v_eff": f"V_eff ≥ {low_v_eff:g}"}[r.subset]
        table.add_row(
            subset,
            r.pair,
            str(r.n),
            f"{r.pearson:+.2f} {ci(r.pearson_ci_low, r.pearson_ci_high)}",
            f"{r.spearman:+.2f} {ci(r.spearman_ci_low, r.spearman_ci_high)}",
            f"{r.pearson_log:+.2f} {ci(r.pearson_log_ci_low, r.pearson_log_ci_high)}",
            f"{r.paper_pearson:+.2f}",
        )
    console.print(table)
    if report.result.n_infinite:
        console.print(f"{report.result.n_infinite} position(s) with δ_TCB = +inf left out")
    print_written(report)


def print_approx(report, model: str) -> None:
    table = Table(title=f"approximation / exact δ_TCB · {model}")
    for name in (
        "V_eff",
        "approximation",
        "n",
        "median",
        "10–90%",
        "geomean",
        "within 2×",
        "Spearman vs exact",
        "expanded form off >0.1%",
    ):
        table.add_column(name, justify="left" if name in ("V_eff", "approximation") else "right")
    for _, r in report.result.summary.iterrows():
        off = r.get("expanded_off_gt_0.1pct")
        table.add_row(
            r.band,
            r.approximation,
            str(r.n),
            fmt(r.get("median_ratio", math.nan)),
            ci(r.get("q10", math.nan), r.get("q90", math.nan)),
            fmt(r.get("geomean_ratio", math.nan)),
            fmt(r.get("within_2x", math.nan)),
            fmt(r.get("spearman_vs_exact", math.nan)),
            "" if off is None or off != off else str(int(off)),
        )
    console.print(table)
    print_written(report)


def print_taboo_sweep(report, task: str, temperature: float) -> None:
    sweep = report.result
    columns = [*_TABOO_COLUMNS, "interventions_per_item", "length_expansion"]
    print_frame(sweep.dose, columns, f"taboo dose · {task} · word-initial, greedy", 20)
    fit = sweep.fit
    console.print(
        f"mean ΔS per intervention ≈ {fit['a']:.3f} + {fit['b']:.3f}·ln i   (R² = {fit['r2']:.3f} over {fit['n']} ranks)"
    )
    if not sweep.ablation.empty:
        print_frame(
            sweep.ablation, ["rank", "mode", *columns[1:]], "word-initial vs mid-word at matched rank (greedy)", 20
        )
    if not sweep.sampled_summary.empty:
        print_frame(
            sweep.sampled_summary,
            list(sweep.sampled_summary.columns),
            f"sampled, τ = {temperature:g}: mean and SD over seeds",
            20,
        )
    print_written(report)


def print_export(result) -> None:
    test = result.card["metrics"]["test"]
    low, high = test["accuracy_ci95"]
    search = result.card["search"]
    console.print(
        f"trial #{result.trial} of {search['study']} ({search['strategy']}): "
        f"test accuracy {fmt(test['accuracy'])} [{fmt(low)}, {fmt(high)}] on {test['n']} items (held out: it chose nothing)"
    )
    if search.get("selection"):
        console.print(f"chosen by: {search['selection']}", markup=False, highlight=False)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    console.print("wrote " + ", ".join(str(p) for p in result.paths))
