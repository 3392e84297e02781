"""Risk–coverage of the fragility signals: if a server flags (and routes away) the answers a signal calls most
fragile, how often do the answers it keeps flip under a perturbation no search saw, and how accurate are they?

From a robustness items table (`robustness_items.parquet` of a compare: its winners' test answers under the judging
suite; the baseline's rows, the task's own prompt, are left out unless asked for), one row per answer (a winner's
clean answer to one item) that some family of `split` perturbed; it *flips*
when some such variant predicts another answer than the clean one (analyses/item_auroc.py's `answers`). For each
signal (δ_TCB, margin, max probability, entropy, oriented as the card's flag reads them: serving/signals.py) and
each coverage c, the ⌈c·n⌉ least fragile answers are kept (ties keep the table's order) and the flip rate and the
clean accuracy among them are measured. Intervals: a seeded percentile bootstrap over items, each item with all its
answers, the kept set chosen anew in every resample; each cheap signal's flip rate minus δ_TCB's at the same
coverage is bootstrapped on the same resamples (paired): an interval above 0 says δ_TCB keeps fewer flipping answers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from promptopt.analyses.item_auroc import answers as flip_answers
from promptopt.errors import UserError
from promptopt.serving.signals import SIGNALS

COVERAGES = (1.0, 0.9, 0.8, 0.7)
TABLE_FILE, FIGURE_FILE = "risk_coverage.csv", "risk_coverage.png"


def _answers(items: pd.DataFrame, split: str) -> pd.DataFrame:
    table = flip_answers(items, split=split)
    keys = [c for c in table.columns if c not in ("n_variants", "changed") and not c.startswith("clean_")]
    clean = items[items["family"].isna()] if "family" in items else items.iloc[:0]
    if len(clean) and "clean_correct" in clean:
        correct = clean.drop_duplicates(keys)[keys + ["clean_correct"]]
        table = table.merge(correct, on=keys, how="left")
    else:  # the clean answer's correctness is on every variant row too
        correct = items.drop_duplicates(keys)[keys + ["clean_correct"]]
        table = table.merge(correct, on=keys, how="left")
    return table


def _kept_rates(scores: np.ndarray, flips: np.ndarray, correct: np.ndarray, coverage: float) -> tuple[float, float]:
    """(flip rate, accuracy) among the ⌈coverage · n⌉ answers with the lowest fragility scores."""
    n = len(scores)
    if n == 0:
        return math.nan, math.nan
    keep = np.argsort(scores, kind="stable")[: max(1, math.ceil(coverage * n - 1e-9))]
    return float(flips[keep].mean()), float(correct[keep].mean())


def risk_coverage(
    items: pd.DataFrame,
    *,
    split: str = "unseen",
    coverages=COVERAGES,
    n_boot: int = 2000,
    seed: int = 0,
    label: str = "",
    include_baseline: bool = False,
) -> pd.DataFrame:
    """One row per (signal, coverage): answers kept, their flip rate and accuracy with 95% intervals, and (cheap
    signals) the flip-rate difference to δ_TCB's at the same coverage with its paired interval."""
    from promptopt.metrics.stats import bootstrap_resamples
    from promptopt.metrics.stats.bootstrap import percentile_interval

    if not include_baseline and "strategy" in items:  # the task's default prompt is no winner a compare exports
        items = items[items["strategy"] != "baseline"]
    table = _answers(items, split)
    if not len(table):
        raise UserError(f"robustness items table{f' ({label})' if label else ''}: no answer has a {split} variant")
    flips = table["changed"].astype(bool).to_numpy()
    correct = table["clean_correct"].astype(bool).to_numpy()
    scores = {}
    for s in SIGNALS:
        column = f"clean_{s.name}"
        values = table[column].to_numpy(dtype=float) if column in table else np.full(len(table), np.nan)
        scores[s.name] = np.array([s.fragility(v) for v in values])
    present = {name: bool(np.isfinite(v).any() or (v == -np.inf).any()) for name, v in scores.items()}
    if not any(present.values()):
        raise UserError(
            f"robustness items table{f' ({label})' if label else ''}: no answer carries a signal "
            "(clean_tcb, clean_margin, clean_top_prob, clean_entropy)"
        )
    clusters = pd.factorize(table["item_id"])[0]
    members = [np.flatnonzero(clusters == c) for c in range(clusters.max() + 1)]
    resamples = bootstrap_resamples(len(members), n_boot=n_boot, seed=seed)
    boot = {}  # (signal, coverage) -> (flip rates, accuracies) over resamples
    for row in resamples:
        index = np.concatenate([members[c] for c in row])
        for name, score in scores.items():
            if not present[name]:
                continue
            for c in coverages:
                boot.setdefault((name, c), []).append(_kept_rates(score[index], flips[index], correct[index], c))
    rows = []
    for s in SIGNALS:
        if not present[s.name]:
            continue
        for c in coverages:
            flip, acc = _kept_rates(scores[s.name], flips, correct, c)
            draws = np.array(boot[(s.name, c)])
            row = {
                "source": label,
                "split": split,
                "signal": s.name,
                "coverage": c,
                "n_answers": len(table),
                "n_items": len(members),
                "n_kept": max(1, math.ceil(c * len(table) - 1e-9)),
                "flip_rate": flip,
                **_interval("flip_rate", percentile_interval(draws[:, 0], 0.95)),
                "accuracy": acc,
                **_interval("accuracy", percentile_interval(draws[:, 1], 0.95)),
            }
            if s.name != "tcb" and present["tcb"]:
                tcb = np.array(boot[("tcb", c)])
                row["flip_rate_minus_tcb"] = flip - _kept_rates(scores["tcb"], flips, correct, c)[0]
                row.update(_interval("flip_rate_minus_tcb", percentile_interval(draws[:, 0] - tcb[:, 0], 0.95)))
            rows.append(row)
    return pd.DataFrame(rows)


def _interval(name: str, interval) -> dict:
    low, high = interval
    return {f"{name}_ci_low": float(low), f"{name}_ci_high": float(high)}


def read_items(path: Path) -> tuple[pd.DataFrame, str]:
    """(the robustness items table of a compare / evaluate folder or a .parquet file, a label: the task)."""
    import json

    path = Path(path)
    file = path / "robustness_items.parquet" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path}: no robustness_items.parquet (a compare with a suite, or evaluate --out, writes it)")
    try:
        items = pd.read_parquet(file)
    except (OSError, ValueError) as exc:
        raise UserError(f"{file}: cannot read the robustness items table ({type(exc).__name__})") from None
    label = path.name
    summary = file.parent / "summary.json"
    if summary.is_file():
        data = json.loads(summary.read_text(encoding="utf-8"))
        label = str(data.get("task") or label)
    return items, label


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Flip rate and accuracy among the kept answers against coverage, one line per signal, 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(dict.fromkeys(table["source"]))
    fig, axes = plt.subplots(2, len(sources), figsize=(4.2 * len(sources), 6.4), squeeze=False, sharex=True)
    labels = {s.name: s.label for s in SIGNALS}
    for col, source in enumerate(sources):
        part = table[table["source"] == source]
        for r, (metric, title) in enumerate((("flip_rate", "flip rate of kept answers"), ("accuracy", "accuracy"))):
            ax = axes[r][col]
            for k, (name, rows) in enumerate(part.groupby("signal", sort=False)):
                x = rows["coverage"].to_numpy() * 100 + (k - 1.5) * 0.6  # side by side, not on top of each other
                y = rows[metric].to_numpy()
                err = np.vstack([y - rows[f"{metric}_ci_low"].to_numpy(), rows[f"{metric}_ci_high"].to_numpy() - y])
                ax.errorbar(x, y, yerr=np.clip(err, 0, None), marker="o", ms=4, capsize=2, label=labels.get(name, name))
            ax.set_title(f"{source}: {title}" if source else title, fontsize=9)
            ax.invert_xaxis()
            ax.grid(alpha=0.3)
            if r == 1:
                ax.set_xlabel("coverage (% of answers kept)")
        axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
    return path


def diagnose_risk_coverage(
    paths: list[Path], *, out: Path | None = None, split: str = "unseen", seed: int = 0, n_boot: int = 2000
) -> tuple[pd.DataFrame, list[Path]]:
    """`promptopt diagnose risk-coverage`: the table (CSV) and the plot (PNG) for one or more runs (tasks)."""
    from promptopt.yamlio import atomic_write_bytes_via, check_output

    if not paths:
        raise UserError("risk-coverage: give at least one compare directory or robustness_items.parquet")
    target = Path(out) if out is not None else (Path(paths[0]) if Path(paths[0]).is_dir() else Path(paths[0]).parent)
    check_output(target, folder=True, what="--out")
    tables = []
    for path in paths:
        items, label = read_items(path)
        tables.append(risk_coverage(items, split=split, seed=seed, n_boot=n_boot, label=label))
    table = pd.concat(tables, ignore_index=True)
    target.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes_via(target / TABLE_FILE, lambda p: table.to_csv(p, index=False))
    figure = target / FIGURE_FILE
    atomic_write_bytes_via(figure, lambda p: plot(table, Path(p)))
    return table, [target / TABLE_FILE, figure]


__all__ = ["COVERAGES", "diagnose_risk_coverage", "plot", "read_items", "risk_coverage"]
