"""The answer first: one sentence per pair of strategies from compare_paired.csv, the paired table and its
forest plot, and the per-strategy table. Significance is compare's own: accuracy is significant when
compare's `significant` flag is set (exact McNemar p < 0.05 and the paired-bootstrap interval excludes 0);
Acc_worst, PDR (and any other paired metric) when the interval excludes 0."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from promptopt.report import figures
from promptopt.report.numbers import (
    cell_estimate,
    esc,
    estimate,
    excludes_zero,
    finite,
    note,
    num,
    sig,
    table,
    td,
    tr,
)
from promptopt.workflows.compare.records import (
    ACCURACY,
    ACCURACY_CI,
    PPL_MEAN,
    SEARCH_SECONDS,
    SELECTED_BY,
    TCB_GEOMEAN,
    TCB_MEDIAN,
    interval_columns,
    sd_column,
)

_METRIC = re.compile(r"^delta_(acc_worst|format_spread|pdr|acc)(?:_(seen|unseen))?$")
_LABELS = {"acc": "accuracy", "acc_worst": "Acc_worst", "pdr": "PDR", "format_spread": "format spread"}
_HIGHER_IS_BETTER = {"acc": True, "acc_worst": True, "pdr": False, "format_spread": False}
RULE = (
    "Δ = first − second on the same test items (pooled over seeds), 95% paired-bootstrap intervals that resample "
    "items. One rule everywhere in this report: an accuracy difference is significant only when the exact McNemar "
    "test (p < 0.05) and the interval (excludes 0) both say so, as compare flags it; where only one does, the "
    "sentence says which. Acc_worst, PDR and other robustness differences have no test: their interval decides."
)


_ROBUST = re.compile(r"^(acc_worst|pdr|format_spread)(?:_(seen|unseen))?$")


def _labelled_only(found: list, base_of, group_of) -> list:
    """Where a number comes labelled seen/unseen, the label is what the reader gets: the all-families column of
    the same metric (kept in the CSVs for older readers) is left out."""
    labelled = {base_of(x) for x in found if group_of(x)}
    return [x for x in found if group_of(x) or base_of(x) not in labelled]


def robust_columns(frame: pd.DataFrame | None) -> list[tuple[str, str]]:
    """(column, label) of the per-prompt robustness numbers a compare table holds with a value: acc_worst and
    pdr, their seen/unseen variants (which replace the unlabelled ones), and format spread where written."""
    if frame is None:
        return []
    found = [(c, _ROBUST.match(c)) for c in frame.columns if _ROBUST.match(c) and frame[c].map(finite).any()]
    found = _labelled_only(found, lambda cm: cm[1].group(1), lambda cm: cm[1].group(2))
    order = list(_LABELS)
    found.sort(key=lambda cm: (order.index(cm[1].group(1)), ("", "seen", "unseen").index(cm[1].group(2) or "")))
    return [(c, _LABELS[m.group(1)] + (f" ({m.group(2)})" if m.group(2) else "")) for c, m in found]


@dataclass(frozen=True)
class Metric:
    col: str  # delta_acc, delta_acc_worst_unseen, ...
    base: str  # acc, acc_worst, pdr, format_spread
    group: str  # '', seen or unseen

    @property
    def label(self) -> str:
        return _LABELS[self.base] + (f" ({self.group})" if self.group else "")


def metrics_of(paired: pd.DataFrame) -> list[Metric]:
    """The paired metrics the table has (with both interval bounds), in reading order."""
    found = []
    for col in paired.columns:
        match = _METRIC.match(col)
        if match and {f"{col}_ci_low", f"{col}_ci_high"} <= set(paired.columns) and paired[col].map(finite).any():
            found.append(Metric(col, match.group(1), match.group(2) or ""))
    found = _labelled_only(found, lambda m: m.base, lambda m: m.base != "acc" and m.group)
    order = list(_LABELS)
    return sorted(found, key=lambda m: (order.index(m.base), ("", "seen", "unseen").index(m.group)))


def significant(row, metric: Metric) -> bool:
    flag = f"{metric.col}_significant"
    if flag in row and row[flag] == row[flag]:
        return bool(row[flag])
    low, high = row[f"{metric.col}_ci_low"], row[f"{metric.col}_ci_high"]
    if metric.base == "acc":
        if "significant" in row and not metric.group:
            return str(row["significant"]).lower() == "true"
        return bool(finite(row.get("mcnemar_p")) and row["mcnemar_p"] < 0.05 and excludes_zero(low, high))
    return excludes_zero(low, high)


def _identical(row, metrics: list[Metric]) -> bool:
    zero = all(row[c] == 0 for m in metrics for c in (m.col, f"{m.col}_ci_low", f"{m.col}_ci_high") if finite(row[c]))
    return zero and row.get("only_a_correct", 1) == 0 and row.get("only_b_correct", 1) == 0


def pvalue(p) -> str:
    if not finite(p):
        return "—"
    return num(p, 2) if p >= 0.01 else f"{p:.1e}"


def test_name(row) -> str:
    """The paired exact test a row's p comes from: 'McNemar' (one seed, and tables written before compare named
    it), or with several seeds the sign-flip test over items that keeps each item's seeds together."""
    name = row.get("paired_test") if hasattr(row, "get") else None
    if not isinstance(name, str) or name == "exact McNemar":
        return "McNemar"
    return name.removeprefix("exact ")


def disagreement(low, high, p, test: str = "McNemar") -> str:
    """Why an accuracy difference is not called significant when one of its two parts says it is ('' when the
    interval and the test agree): the one rule, said where it decides."""
    if not finite(p):
        return ""
    interval_says, test_says = excludes_zero(low, high), float(p) < 0.05
    if interval_says and not test_says:
        return f": its interval excludes 0 but {test} p = {pvalue(p)} ≥ 0.05, and both must agree"
    if test_says and not interval_says:
        return f": {test} p = {pvalue(p)} < 0.05 but its interval includes 0, and both must agree"
    return ""


def clause(row, metric: Metric) -> str:
    value = row[metric.col]
    if not finite(value):
        return f"{metric.label} not measured"
    low, high = row[f"{metric.col}_ci_low"], row[f"{metric.col}_ci_high"]
    text = f"{metric.label} {estimate(value, low, high, signed=True)}"
    if metric.base == "acc" and finite(row.get("mcnemar_p")):
        text += f", {test_name(row)} p = {pvalue(row['mcnemar_p'])}"
    if not significant(row, metric):
        return (
            text
            + ", not significant"
            + (disagreement(low, high, row.get("mcnemar_p"), test_name(row)) if metric.base == "acc" else "")
        )
    better = row["a"] if (value > 0) == _HIGHER_IS_BETTER[metric.base] else row["b"]
    return text + f", significant (favours {better})"


def sentence(row, metrics: list[Metric], n_label: str) -> str:
    head = f"<b>{esc(row['a'])} vs {esc(row['b'])}</b>"
    if _identical(row, metrics):
        return (
            f"{head}: no difference: right and wrong on exactly the same of the {n_label}, every Δ exactly 0 "
            "(not significant)."
        )
    return f"{head}: " + "; ".join(esc(clause(row, m)) for m in metrics) + "."


def _ordered(paired: pd.DataFrame) -> tuple[list, list]:
    """Pairs of searched strategies first (δ_TCB vs PPL leading, the question compare answers), then each
    strategy against the task's default prompt."""
    rows = [r for _, r in paired.iterrows()]
    searched = [r for r in rows if "baseline" not in (r["a"], r["b"])]
    searched.sort(key=lambda r: {r["a"], r["b"]} != {"tcb", "ppl"})
    return searched, [r for r in rows if "baseline" in (r["a"], r["b"])]


def _n_label(row, seeds: int) -> str:
    n = int(row["n_pairs"]) if finite(row.get("n_pairs")) else None
    return f"{n} paired (seed, item) answers" if seeds > 1 else f"{n} paired test items"


def verdict_compare(paired: pd.DataFrame | None, summary: dict) -> str:
    if paired is None or paired.empty:
        return note("compare_paired.csv is missing: nothing paired to report.")
    metrics = metrics_of(paired)
    seeds = int(summary.get("seeds") or 1)
    searched, baseline = _ordered(paired)
    differing = [r for r in searched if any(significant(r, m) for m in metrics)]
    out = []
    if searched:
        names = "; ".join(
            f"{r['a']} vs {r['b']} ({', '.join(m.label for m in metrics if significant(r, m))})" for r in differing
        )
        out.append(
            f'<p class="headline">{len(differing)} of {len(searched)} pair{"s" if len(searched) > 1 else ""} of strategies '
            f"differ{'s' if len(searched) == 1 else ''} significantly on at least one measure"
            + (f": {esc(names)}." if differing else ".")
            + "</p>"
        )
    for title, rows in (
        ("Strategy against strategy", searched),
        ("Against the task's default prompt (baseline)", baseline),
    ):
        if rows:
            items = "".join(
                f'<li class="verdict" data-a="{esc(r["a"])}" data-b="{esc(r["b"])}">{sentence(r, metrics, _n_label(r, seeds))}</li>'
                for r in rows
            )
            out.append(f"<h3>{title}</h3><ul>{items}</ul>")
    robust_n = summary.get("n_robust")
    where = (
        f" Robustness (Acc_worst, PDR) is measured on the first {robust_n} test items under suite {esc(summary.get('suite'))}."
        if robust_n
        else ""
    )
    if robust_n and "families_unseen" in summary:
        where += (
            f" Unseen families (no search looked at them): {esc(', '.join(summary['families_unseen']) or 'none')}; seen (search "
            f"suite {esc(summary.get('search_suite') or 'none')}, same name or operator): {esc(', '.join(summary.get('families_seen') or []) or 'none')}."
        )
    out.append(note(esc(RULE) + where))
    return "".join(out)


def paired_section(paired: pd.DataFrame | None, summary: dict) -> str:
    if paired is None or paired.empty:
        return note("No paired table (compare_paired.csv) in this run.")
    metrics = metrics_of(paired)
    searched, baseline = _ordered(paired)
    headers = (
        ["Pair (first − second)", "n"]
        + [f"Δ {m.label}" for m in metrics]
        + ["exact p (test)", "only first / only second right"]
    )
    rows = []
    for r in searched + baseline:
        cells = [
            td(f"{r['a']} vs {r['b']}", left=True),
            td(str(int(r["n_pairs"])) if finite(r.get("n_pairs")) else "—", value=r.get("n_pairs"), col="n_pairs"),
        ]
        for m in metrics:
            cells.append(
                cell_estimate(
                    r[m.col],
                    r[f"{m.col}_ci_low"],
                    r[f"{m.col}_ci_high"],
                    signed=True,
                    col=m.col,
                    mark=significant(r, m),
                )
            )
        p = r.get("mcnemar_p")
        cells.append(td(f"{pvalue(p)} ({test_name(r)})", value=p, col="mcnemar_p"))
        counts = f"{int(r['only_a_correct'])} / {int(r['only_b_correct'])}" if finite(r.get("only_a_correct")) else "—"
        cells.append(td(counts))
        rows.append(tr(cells, a=r["a"], b=r["b"]))
    forest_rows = [
        {
            "label": f"{r['a']} vs {r['b']}",
            **{m.col: (r[m.col], r[f"{m.col}_ci_low"], r[f"{m.col}_ci_high"], significant(r, m)) for m in metrics},
        }
        for r in searched + baseline
    ]
    height = 160 + 34 * len(forest_rows)
    return (
        table(headers, rows, table_id="paired-table")
        + note(
            "* significant: for accuracy, the exact paired test's p < 0.05 and the interval excludes 0, both; for "
            "robustness numbers, the interval excludes 0. The test is McNemar's with one seed; with several, a "
            "sign-flip test over items (each item's seeds flipped together, as the bootstrap keeps them together). A cell where only one of accuracy's two holds is not starred, and its sentence "
            "above says which. Intervals under each Δ."
        )
        + figures.embed(figures.forest(forest_rows, [(m.col, m.label) for m in metrics]), "forest", max(300, height))
    )


# --- per strategy ----------------------------------------------------------------------------------------
def _get(row, key):
    value = row.get(key) if hasattr(row, "get") else None
    return value if finite(value) else None


def strategy_section(compare: pd.DataFrame, candidates: pd.DataFrame | None, summary: dict) -> str:
    seeds = int(summary.get("seeds") or 1)
    n_robust = summary.get("n_robust")
    robust = robust_columns(compare)
    headers = (
        ["Strategy", "Seeds", "Test items", "Accuracy"]
        + (["Robust items"] if robust else [])
        + [label for _, label in robust]
        + ["AccVar (pert.)", "Worst family", "median δ_TCB", "geomean δ_TCB", "mean PPL", "Search time"]
    )
    rows = []
    for _, r in compare.iterrows():
        many = seeds > 1 and r["strategy"] != "baseline"
        cells = [
            td(r["strategy"], left=True),
            td(str(int(r["n_seeds"])) if finite(r.get("n_seeds")) else "1"),
            td(str(int(r["n_test"])), value=r["n_test"], col="n_test"),
            cell_estimate(
                r[ACCURACY],
                *(r.get(c) for c in ACCURACY_CI),
                col=ACCURACY,
                sd=r.get(sd_column(ACCURACY)) if many else None,
            ),
            *([td(str(n_robust) if n_robust else "—")] if robust else []),
            *[
                cell_estimate(
                    r.get(key),
                    *(r.get(c) for c in interval_columns(key)),
                    col=key,
                    sd=r.get(sd_column(key)) if many else None,
                )
                for key, _ in robust
            ],
            td(sig(r.get("acc_var_pert")), value=r.get("acc_var_pert")),
            td(str(r.get("acc_worst_family")) if isinstance(r.get("acc_worst_family"), str) else "—", left=True),
            td(sig(r.get(TCB_MEDIAN)), value=r.get(TCB_MEDIAN)),  # not the mean: one item can be all of it
            td(sig(r.get(TCB_GEOMEAN)), value=r.get(TCB_GEOMEAN)),
            td(sig(r.get(PPL_MEAN)), value=r.get(PPL_MEAN)),
            td(f"{sig(r.get(SEARCH_SECONDS))} s" if finite(r.get(SEARCH_SECONDS)) else "—"),
        ]
        rows.append(tr(cells, strategy=r["strategy"]))
    out = [table(headers, rows, table_id="strategies-table")]
    if seeds > 1:
        out.append(
            note(
                f"Mean ± sd over {seeds} seeds. The accuracy interval is the Wilson interval of all seeds' answers pooled; "
                "compare writes no pooled interval for Acc_worst and PDR (each seed's own is below)."
            )
        )
    else:
        out.append(
            note(
                "Accuracy: Wilson 95% interval on the test items. Acc_worst, PDR: compare's bootstrap intervals on the robustness items."
            )
        )
    chosen = [
        (r["strategy"], r[SELECTED_BY])
        for _, r in compare.iterrows()
        if r["strategy"] != "baseline" and isinstance(r.get(SELECTED_BY), str)
    ]
    if chosen:
        out.append(
            '<p>How each search picked its winner:</p><ul class="small">'
            + "".join(f"<li><b>{esc(s)}</b>: {esc(how)}</li>" for s, how in chosen)
            + "</ul>"
        )
    if candidates is not None and len(candidates):
        out.append(_candidates(candidates, seeds))
    return "".join(out)


def _candidates(candidates: pd.DataFrame, seeds: int) -> str:
    """Each search's evaluated candidates (winner marked), one row per (strategy, seed, rank), folded away."""
    robust = robust_columns(candidates)
    headers = ["Strategy", "Seed", "Rank", "Winner", "Trial", "Dev accuracy", "Test accuracy"] + [
        label for _, label in robust
    ]
    rows = []
    for _, r in candidates.iterrows():
        trial = r.get("trial")
        rows.append(
            tr(
                [
                    td(r["strategy"], left=True),
                    td(str(int(r["seed"])) if finite(r.get("seed")) else "0"),
                    td(str(int(r["rank"])) if finite(r.get("rank")) else "0"),
                    td("✓" if str(r.get("winner")).lower() == "true" else ""),
                    td(str(int(trial)) if finite(trial) else "—"),
                    td(num(r.get("dev_accuracy"), 3)),
                    cell_estimate(r[ACCURACY], *(r.get(c) for c in ACCURACY_CI), col=ACCURACY),
                    *[
                        cell_estimate(r.get(key), *(r.get(c) for c in interval_columns(key)), col=key)
                        for key, _ in robust
                    ],
                ],
                strategy=r["strategy"],
                seed=r.get("seed", 0),
            )
        )
    what = "one row per seed and evaluated candidate" if seeds > 1 else "every evaluated top-N candidate"
    return (
        f'<details id="per-seed"><summary>{len(rows)} rows: {what} (winner ✓)</summary>'
        + table(headers, rows, table_id="candidates-table")
        + "</details>"
    )


def winners_of(candidates: pd.DataFrame | None, compare: pd.DataFrame) -> pd.DataFrame:
    """One row per (strategy, seed) winner with its robustness intervals, labelled for a plot axis."""
    if candidates is not None and "winner" in candidates:
        chosen = candidates[candidates["winner"].astype(str).str.lower() == "true"].copy()
        many = chosen["seed"].nunique() > 1 if "seed" in chosen else False
        chosen["label"] = [
            f"{s} · seed {int(d)}" if many and s != "baseline" else s
            for s, d in zip(chosen["strategy"], chosen.get("seed", 0))
        ]
        return chosen
    return compare.assign(label=compare["strategy"])
