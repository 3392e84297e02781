"""What the CLI shows of robustness numbers: compare's tables, one prompt's families, diagnose proxy; each
number labelled seen or unseen (by the search suite), as the library computed it."""

from __future__ import annotations

from rich.table import Table

from promptopt.cli.render import ci, console, fmt, name_column, pm, print_frame, print_summary


def _nan(row, key):
    value = row.get(key, float("nan"))
    return float("nan") if value is None else value


def _paired_test(paired) -> str:
    """The exact test the paired table's p-values come from (compare names it per row; one per compare)."""
    if "paired_test" not in paired or paired.empty:
        return "exact McNemar"
    names = sorted(set(paired["paired_test"].astype(str)))
    return ", ".join(names) + (" (each item's seeds flipped together)" if names != ["exact McNemar"] else "")


def print_dev_choices(choices: list[dict]) -> None:
    """How the searches chose on dev: how many trials tied with the best, and the smallest accuracy difference the
    dev size detects (paired, 80% power) — a dev set too small to choose shows here."""
    import statistics

    known = [c for c in choices if c.get("mde") is not None]
    if not known:
        return
    tied = ", ".join(
        f"{c['strategy']}/{c['seed']} "
        + (f"{c['tied']} of {c['n_candidates']}" if c.get("n_candidates") else "none finished (the incumbent kept)")
        for c in choices
    )
    mde = statistics.median(c["mde"] for c in known)
    console.print(
        f"dev choice: {known[0]['n_dev_items']} dev items detect a difference of {mde:.3f} in accuracy (median over "
        f"the searches; paired, 80% power); trials tied with the best: {tied}",
        markup=False,
        highlight=False,
    )


def print_compare(result, task: str, model: str) -> None:
    from promptopt.workflows.compare.records import (
        ACCURACY,
        ACCURACY_CI,
        DELTA_ACCURACY,
        PPL_MEAN,
        SEARCH_SECONDS,
        SELECTED_BY,
        TCB_GEOMEAN,
        TCB_MEDIAN,
        interval_columns,
        sd_column,
    )

    s = result.summary
    seen, unseen = s.get("families_seen") or [], s.get("families_unseen") or []
    splits = [
        split for split, names in (("unseen", unseen), ("seen", seen)) if names
    ]  # a split with no family prints nothing
    table = Table(title=f"compare · {task} · {s['n_test']} test items · {model} · seeds {s['seeds']}")
    columns = ["strategy", "Acc", "Acc 95% CI", "δ_TCB median", "δ_TCB geomean", "PPL"]
    for split in splits:
        columns += [f"AccVar_pert {split}", f"PDR {split}", f"Acc_worst {split}", f"Acc_worst {split} 95% CI"]
    columns += ["taboo R(i=1)", "search s"]
    name_column(table, "strategy", result.table["strategy"])
    for name in columns[1:]:
        table.add_column(name, justify="right")
    for _, r in result.table.iterrows():
        cells = [
            r.strategy,
            pm(r[ACCURACY], r[sd_column(ACCURACY)]),
            ci(*(r[c] for c in ACCURACY_CI)),
            pm(_nan(r, TCB_MEDIAN), _nan(r, sd_column(TCB_MEDIAN))),  # robust: pmi can make one item the whole mean
            pm(_nan(r, TCB_GEOMEAN), _nan(r, sd_column(TCB_GEOMEAN))),
            pm(r[PPL_MEAN], r[sd_column(PPL_MEAN)]),
        ]
        for split in splits:
            cells += [
                fmt(_nan(r, f"acc_var_pert_{split}")),
                pm(_nan(r, f"pdr_{split}"), _nan(r, sd_column(f"pdr_{split}"))),
                pm(_nan(r, f"acc_worst_{split}"), _nan(r, sd_column(f"acc_worst_{split}"))),
                ci(*(_nan(r, c) for c in interval_columns(f"acc_worst_{split}"))),
            ]
        table.add_row(*cells, fmt(r.taboo_retention_i1), fmt(r[SEARCH_SECONDS]))
    console.print(table)
    if s.get("suite"):
        console.print(
            f"judged on suite {s['suite']}; search suite {s.get('search_suite') or 'none'}: "
            f"unseen {', '.join(unseen) or '(none)'}; seen {', '.join(seen) or '(none)'}",
            markup=False,
            highlight=False,
        )
    print_dev_choices(s.get("dev_choices") or [])
    paired = Table(
        title="paired on the same test items (a − b): 95% paired-bootstrap intervals, "
        f"{_paired_test(result.paired)}; * = significant at 0.05"
    )  # "exact McNemar" with one seed, else the sign-flip test over items
    test = _paired_test(result.paired)
    names = ["a", "b", "Δ Acc", "95% CI", "McNemar p" if test == "exact McNemar" else "exact p"]
    for split in splits:
        names += [f"Δ Acc_worst {split}", f"95% CI {split} ", f"Δ PDR {split}", f"95% CI {split}  "]
    for name in ("a", "b"):
        name_column(paired, name, result.paired[name] if name in result.paired else [])
    for name in names[2:]:
        paired.add_column(name, justify="right")
    for _, r in result.paired.iterrows():
        cells = [
            r.a,
            r.b,
            f"{r[DELTA_ACCURACY]:+.3f}{' *' if r.significant else ''}",
            ci(*(r[c] for c in interval_columns(DELTA_ACCURACY))),
            f"{r.mcnemar_p:.3g}",
        ]
        for split in splits:
            for key in ("acc_worst", "pdr"):
                col = f"delta_{key}_{split}"
                cells += [fmt(_nan(r, col)), ci(*(_nan(r, c) for c in interval_columns(col)))]
        paired.add_row(*cells)
    console.print(paired)
    for _, r in result.table.iterrows():
        if r.strategy != "baseline":
            console.print(f"{r.strategy}: {r[SELECTED_BY]}")
    s = result.summary
    reuse = (
        f"reuse: {s['evaluations']} distinct prompts evaluated, {s['evaluations_reused']} shared with another search, "
        f"{s['evaluations_resumed']} taken from an earlier run; {len(s['studies_resumed'])} studies resumed; "
        f"result cache {s['result_cache_hits']} hits, {s['result_cache_misses']} misses"
    )
    if s.get("variant_embedding_hit_rate") is not None:
        reuse += f"; variant embeddings reused {fmt(s['variant_embedding_hit_rate'])}"
    if s.get("paraphrase_memo_hits") or s.get("paraphrase_memo_misses"):
        reuse += f"; LM paraphrases reused {s['paraphrase_memo_hits']}, generated {s['paraphrase_memo_misses']}"
    console.print(reuse)


def print_robustness(result, task: str, suite: str) -> None:
    columns = [
        "family",
        "seen",
        "n_variants",
        "dropped_not_applicable",
        "dropped_protection",
        "dropped_similarity",
        "acc_clean_same_items",
        "acc_perturbed",
        "pdr",
        "tcb_clean_mean",
        "tcb_perturbed_mean",
    ]
    families = result.families
    if "seen" in families:
        families = families.assign(seen=families["seen"].map({True: "seen", False: "unseen"}))
    print_frame(
        families,
        columns,
        f"robustness · {task} · suite {suite} (seen/unseen: by search suite "
        f"{result.summary.get('search_suite') or 'none'})",
        50,
    )
    print_summary(result.summary, "summary")


def print_proxy(result, n_runs: int) -> None:
    if result.prompts is not None:
        print_frame(result.prompts, list(result.prompts.columns), f"proxy · {n_runs} run(s) · prompts", 50)
        table = Table(title="Spearman ρ across prompts, 95% bootstrap interval over prompts (* = excludes 0)")
        for name in ("signal", "target", "n", "ρ", "95% CI"):
            table.add_column(name, justify="left" if name in ("signal", "target") else "right")
        for _, r in result.correlations.iterrows():
            table.add_row(
                r.signal,
                r.target,
                str(r.n_prompts),
                f"{r.spearman:+.3f}{' *' if r.interval_excludes_0 else ''}",
                ci(r.ci_low, r.ci_high),
            )
        console.print(table)
    if result.auroc is not None:
        a = result.auroc
        n = int(a["n_answers"].max()) if len(a) else 0
        table = Table(
            title=f"item-level AUROC for 'this answer changes under some unseen perturbation' · {n} answers, "
            f"{int(a['n_items'].max()) if len(a) else 0} items · 95% bootstrap over items (* = excludes 0.5)"
        )
        for name in ("signal", "brittle when", "answers", "changed", "AUROC", "95% CI"):
            table.add_column(name, justify="left" if name in ("signal", "brittle when") else "right")
        for _, r in a.iterrows():
            table.add_row(
                r.signal,
                r.orientation,
                str(r.n_answers),
                str(r.n_changed),
                f"{fmt(r.auroc)}{' *' if r.interval_excludes_half else ''}",
                ci(r.ci_low, r.ci_high),
            )
        console.print(table)
        if not n or not a["n_changed"].any():
            console.print(
                "no answer changed under an unseen family (or none was perturbed by one): the AUROC is undefined here"
            )
    console.print("wrote " + ", ".join(str(p) for p in result.written))


def print_risk_coverage(frame) -> None:
    """`diagnose risk-coverage`: per source, flip rate and accuracy of the kept answers by signal and coverage."""
    for source, part in frame.groupby("source", sort=False):
        first = part.iloc[0]
        table = Table(
            title=f"{source}: answers kept when the most fragile are flagged · {first.n_answers} answers, "
            f"{first.n_items} items, {first.split} families · 95% bootstrap over items"
        )
        for name in ("signal", "coverage", "kept", "flip rate", "95% CI", "accuracy", "95% CI ", "− δ_TCB flip rate"):
            table.add_column(name, justify="left" if name == "signal" else "right")
        for _, r in part.iterrows():
            diff = r.get("flip_rate_minus_tcb")
            table.add_row(
                r.signal,
                f"{r.coverage:.0%}",
                str(r.n_kept),
                fmt(r.flip_rate),
                ci(r.flip_rate_ci_low, r.flip_rate_ci_high),
                fmt(r.accuracy),
                ci(r.accuracy_ci_low, r.accuracy_ci_high),
                ""
                if diff is None or diff != diff
                else f"{diff:+.3f} {ci(r.flip_rate_minus_tcb_ci_low, r.flip_rate_minus_tcb_ci_high)}",
            )
        console.print(table)
