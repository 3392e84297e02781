"""The sections below the verdict: robustness per family, the search itself, and what else the directory
holds (diagnose proxy, stress sweeps, taboo tables). A section with nothing measured says so in one line."""

from __future__ import annotations

import base64
import math

import pandas as pd

from promptopt.report import figures
from promptopt.report.families import family_table, flips, usable
from promptopt.report.numbers import cell_estimate, esc, estimate, finite, note, num, sig, table, td, tr
from promptopt.report.verdict import robust_columns


def _families_line(names: list[str], what: str) -> str:
    joined = ", ".join(f"<b>{esc(n)}</b>" for n in names)
    return f'<p class="families" data-families="{esc(",".join(names))}">{what}: {joined}.</p>'


def _suite_families(name) -> list[str]:
    from promptopt.robustness.suite import load_suite

    try:
        return [f.name for f in load_suite(str(name)).families]
    except Exception:  # a suite file moved since the run: the name alone is still worth showing
        return []


# --- robustness --------------------------------------------------------------------------------------------
def robustness_section(source, chosen, winners: pd.DataFrame | None) -> str:
    out = []
    if usable(source.items):
        out.append(_from_items(source.items, chosen))
        columns = robust_columns(winners) if source.kind == "compare" else []
        if columns:  # each winner's own numbers and intervals, labelled seen / unseen
            out.append(figures.embed(figures.strategy_robustness(winners, columns), "robustness-winners", 380))
    elif source.kind == "compare":
        suite = source.summary.get("suite")
        if not suite:
            out.append(note("compare ran without a perturbation suite (--suite none): no robustness measured."))
        else:
            names = _suite_families(suite)
            n = source.summary.get("n_robust")
            out.append(
                _families_line(names, f"Families measured by compare (suite {esc(suite)}, on the first {n} test items)")
                if names
                else note(
                    f"Suite {esc(suite)} on the first {n} test items: not a built-in suite, and compare "
                    "records only its name, so its families cannot be listed here."
                )
            )
            out.append(
                note(
                    "Per-family numbers are not written by compare today (compare_runs.csv keeps only each prompt's "
                    "worst family): <code>promptopt evaluate --prompt CARD --suite "
                    + esc(suite)
                    + " --out "
                    + esc(source.root)
                    + "/robustness</code> writes them, and this section then plots them."
                )
            )
            columns = robust_columns(winners)
            if columns:
                out.append(figures.embed(figures.strategy_robustness(winners, columns), "robustness-winners", 380))
    for path, frame, side in source.families:
        out.append(_evaluate_table(path, frame, side))
    for path, frame in source.taboo:
        out.append(figures.embed(figures.taboo(frame, f"Taboo retention vs rank · {path.name}"), "taboo", 360))
    if not out:
        out.append(
            note(
                "Nothing measured: no perturbation suite ran here (compare with --suite, or <code>promptopt evaluate --out</code>)."
            )
        )
    return "".join(out)


def _from_items(items: pd.DataFrame, chosen) -> str:
    table_ = family_table(items)
    out = [_families_line(list(dict.fromkeys(table_["family"])), "Families measured (robustness_items.parquet)")]
    height = 560 + 10 * table_["family"].nunique()
    out.append(
        figures.embed(
            figures.family_dots(table_, "Per family and strategy, on the same items (95% intervals)"),
            "families",
            height,
        )
    )
    mine = items
    if chosen is not None and chosen.strategy and "strategy" in items and (items["strategy"] == chosen.strategy).any():
        mine = items[items["strategy"] == chosen.strategy]
        if "seed" in mine and chosen.seed is not None and (mine["seed"] == chosen.seed).any():
            mine = mine[mine["seed"] == chosen.seed]
    cells = flips(mine)
    who = f"{chosen.strategy}, seed {chosen.seed}" if chosen is not None and chosen.strategy else "the prompt"
    n_items = cells["item"].nunique()
    broken = int((cells["code"] == 3).sum())
    out.append(
        figures.embed(
            figures.flip_map(cells, f"Which answers changed: the chosen prompt ({who}), items × families"),
            "flips",
            min(1600, 200 + 16 * n_items),
        )
    )
    out.append(
        note(
            f"{broken} of {len(cells)} (item, family) cells have a variant whose answer broke. Hover a cell for its variants."
        )
    )
    return "".join(out)


def _evaluate_table(path, frame: pd.DataFrame, side: dict) -> str:
    """An `evaluate --out` family table: accuracies with Wilson intervals on its variants (the table has no
    per-family PDR interval)."""
    from promptopt.metrics.stats import wilson_interval

    rows = []
    for r in frame.itertuples():
        n = int(r.n_variants) if "n_variants" in frame and finite(r.n_variants) else 0

        def ci(p, n=n):
            return wilson_interval(round(p * n), n) if n and finite(p) else (math.nan, math.nan)

        rows.append(
            {
                "strategy": "",
                "group": "",
                "family": r.family,
                "n_variants": n,
                "acc_clean": r.acc_clean_same_items,
                "acc_clean_ci": ci(r.acc_clean_same_items),
                "acc_perturbed": r.acc_perturbed,
                "acc_perturbed_ci": ci(r.acc_perturbed),
                "pdr": getattr(r, "pdr", math.nan),
                "pdr_ci": (math.nan, math.nan),
            }
        )
    dots = pd.DataFrame(rows)
    out = [
        _families_line([str(f) for f in frame["family"]], f"Families measured ({esc(path.name)})"),
        figures.embed(
            figures.family_dots(dots, f"Perturbation families · {path.name} (Wilson 95% on each family's variants)"),
            "families",
            560,
        ),
    ]
    headers = ["Family", "Variants", "Clean accuracy (same items)", "Perturbed accuracy", "PDR"]
    body = [
        tr(
            [
                td(r["family"], left=True),
                td(str(r["n_variants"])),
                cell_estimate(r["acc_clean"], *r["acc_clean_ci"]),
                cell_estimate(r["acc_perturbed"], *r["acc_perturbed_ci"]),
                td(num(r["pdr"], 3), value=r["pdr"]),
            ]
        )
        for r in rows
    ]
    out.append(table(headers, body))
    if side:
        out.append(note(esc(evaluate_sentence(side))))
    return "".join(out)


def evaluate_sentence(side: dict) -> str:
    parts = [f"clean accuracy {num(side.get('acc_clean'), 3)}"]
    for key, label in (("acc_worst", "Acc_worst"), ("pdr", "PDR")):
        low, high = (side.get(f"{key}_ci95") or [None, None])[:2]
        parts.append(f"{label} {estimate(side.get(key), low, high)}")
    worst = side.get("acc_worst_family")
    return (
        f"Suite {side.get('suite')} on {side.get('n_items')} items: "
        + "; ".join(parts)
        + (f"; worst family {worst}" if worst else "")
        + "."
    )


# --- also measured -----------------------------------------------------------------------------------------
def proxy_section(source) -> str:
    out = []
    if source.proxy is not None and len(source.proxy):
        c = source.proxy
        out.append(figures.embed(figures.proxy(c), "proxy", 160 + 34 * c["signal"].nunique()))
        rows = [
            tr(
                [
                    td(r["signal"], left=True),
                    td(r["target"], left=True),
                    td(str(r["n_prompts"])),
                    cell_estimate(
                        r["spearman"],
                        r["ci_low"],
                        r["ci_high"],
                        signed=True,
                        col="spearman",
                        mark=str(r["interval_excludes_0"]).lower() == "true",
                    ),
                ]
            )
            for _, r in c.iterrows()
        ]
        out.append(
            table(["Signal", "Robustness target", "Prompts", "Spearman ρ [95% CI]"], rows, table_id="proxy-table")
        )
    if source.auroc is not None and len(source.auroc):
        a = source.auroc
        out.append(
            "<h3>Item-level AUROC</h3>"
            + table(
                list(map(str, a.columns)),
                [
                    tr(
                        [
                            td(
                                v if isinstance(v, str) else sig(v),
                                left=isinstance(v, str),
                                value=None if isinstance(v, str) else v,
                            )
                            for v in row
                        ]
                    )
                    for row in a.itertuples(index=False)
                ],
                table_id="auroc-table",
            )
        )
    if not out:
        return note(
            "Not measured: no diagnose proxy tables here (<code>promptopt diagnose proxy RUN_DIR/*</code> writes them)."
        )
    return "".join(out)


def sweep_section(source) -> str:
    if source.sweep is None:
        return note(
            "Not measured: no stress sweep here (<code>promptopt stress --models … --tasks … --out DIR</code>)."
        )
    s = source.sweep
    rows = [
        tr(
            [
                td(r["model"], left=True),
                td(r["task"], left=True),
                td("baseline" if r["rank"] == 0 else f"i={int(r['rank'])}"),
                td(str(int(r["n"])) if finite(r.get("n")) else "—"),
                td(num(r.get("accuracy"), 3), value=r.get("accuracy")),
                cell_estimate(
                    r.get("retention"), r.get("retention_ci_low"), r.get("retention_ci_high"), col="retention"
                ),
                td(sig(r.get("length_expansion")), value=r.get("length_expansion")),
            ]
        )
        for _, r in s.iterrows()
    ]
    out = [
        table(
            ["Model", "Task", "Condition", "n", "Accuracy", "Retention [95% Wilson]", "Length × baseline"],
            rows,
            table_id="sweep-table",
        )
    ]
    for path in source.sweep_figures:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        out.append(
            f'<figure><img alt="{esc(path.name)}" src="data:image/png;base64,{data}" style="max-width:100%">'
            f"<figcaption>{esc(path.name)}</figcaption></figure>"
        )
    return "".join(out)


def sweep_sentence(sweep: pd.DataFrame) -> str:
    parts = []
    for (model, task), part in sweep.groupby(["model", "task"], sort=False):
        ranked = part[part["rank"] > 0].sort_values("rank")
        if len(ranked):
            r = ranked.iloc[0]
            parts.append(
                f"{str(model).rstrip('/').split('/')[-1]} on {task}: retention at i={int(r['rank'])} "
                f"{estimate(r['retention'], r['retention_ci_low'], r['retention_ci_high'])}"
            )
    return "Taboo stress sweep: " + "; ".join(parts) + "." if parts else "Taboo stress sweep with no ranked condition."


def rounds_sentence(source) -> str:
    """search --rounds: each round's winner on dev, and the last one's on test."""
    rounds = source.summary.get("rounds") or []
    path = " → ".join(f"{r['dev_accuracy']:.3f}" for r in rounds)
    added = sum(len(r.get("proposed") or []) for r in rounds)
    last = source.studies[-1].run.summary
    test = last.get("test") or {}
    sentence = (
        f"{len(rounds)} rounds of {source.studies[-1].run.config.study.strategy} search over a space that grew by {added} "
        f"proposed instructions; each round's winner on dev: {path} (each round starts from the previous best). The last "
        f"round's winner scores {estimate(test.get('accuracy'), *(test.get('accuracy_ci95') or [None, None])[:2])} on "
        f"{test.get('n')} test items."
    )
    return esc(sentence)


def incumbent_sentence(summary: dict) -> str:
    """What the search did with the prompt it started from (study/incumbent.py), and what its scan said; "" for a run
    without an incumbent (made with --incumbent none, or before incumbents)."""
    incumbent, scan = summary.get("incumbent"), summary.get("scan")
    parts = []
    if incumbent:
        parts.append(str(incumbent.get("why") or ("kept the incumbent" if incumbent.get("kept") else "replaced it")))
    if scan:
        parts.append(f"The scan before the trials said: {scan.get('verdict')} ({scan.get('why')})")
    return " ".join(p if p.endswith(".") else p + "." for p in parts)


def search_sentence(source) -> str:
    s = source.studies[0]
    summary = s.run.summary
    test, dev = summary.get("test") or {}, summary.get("dev") or {}
    n_trials = len(s.study.trials)
    first = incumbent_sentence(summary)
    sentence = (
        (first[0].upper() + first[1:] + " " if first else "")
        + f"A single {s.strategy} search ({n_trials} trials): the shipped prompt, trial #{summary.get('best_trial')}, scores "
        f"{estimate(test.get('accuracy'), *(test.get('accuracy_ci95') or [None, None])[:2])} on {test.get('n')} test items "
        f"and {estimate(dev.get('accuracy'), *(dev.get('accuracy_ci95') or [None, None])[:2])} on {dev.get('n')} dev items."
    )
    return (
        esc(sentence)
        + " Nothing to compare it with here: <code>promptopt compare</code> answers whether one strategy beats another."
    )
