"""What the card `promptopt export` ships did, seed by seed, in a finished compare (issue 51's experiment).

`export RUN` chooses among every search winner of the compare by dev numbers alone (the paired tie set and its
tie-break: promptopt/workflows/export/select.py). Over seeds, the comparable entry is that rule applied to each seed's
winners: "shipped" is, per seed, the winner export's selection chooses among that seed's searches. This script
builds that entry from the compare's own per-item tables (test_items.parquet, robustness_items.parquet) and pairs
it with the compare's other entries exactly as the compare's paired table does (same items, same clustered
bootstrap, same seed), so "shipped − accuracy" reads like every row of compare_paired.csv. No test number chooses:
the selection reads compare_runs.csv's dev columns only.

    .venv/bin/python bench/shipped_vs_accuracy.py [--seed S] runs/i51/copa [runs/i51/arc_easy ...]

It first re-pairs one pair the compare already paired and checks that it reproduces compare_paired.csv (the
reconstruction is the compare's own input, or the script stops).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from promptopt.workflows.compare.evaluate import Evaluated
from promptopt.workflows.compare.paired import paired_table
from promptopt.workflows.export.select import compare_candidates, select_by_dev

COLUMNS = [
    "delta_acc",
    "delta_acc_ci_low",
    "delta_acc_ci_high",
    "mcnemar_p",
    "delta_acc_worst_unseen",
    "delta_acc_worst_unseen_ci_low",
    "delta_acc_worst_unseen_ci_high",
]


def evaluations(root: Path) -> dict[str, list[Evaluated]]:
    """Each compare entry's per-seed evaluations, rebuilt from the compare's per-item tables."""
    test = pd.read_parquet(root / "test_items.parquet")
    robust = pd.read_parquet(root / "robustness_items.parquet")
    out: dict[str, list[Evaluated]] = {}
    for (strategy, seed), rows in test.groupby(["strategy", "seed"], sort=False):
        stressed = robust[(robust["strategy"] == strategy) & (robust["seed"] == seed)]
        clean = stressed[stressed["variant_kind"] == "clean"]
        perturbed = stressed[stressed["variant_kind"] != "clean"]
        evaluated = Evaluated(
            rows.reset_index(drop=True),
            clean=clean.set_index("item_id")["clean_correct"].astype(bool),
            variants=pd.DataFrame(
                {
                    "item_id": perturbed["item_id"].to_numpy(),
                    "family": perturbed["family"].to_numpy(),
                    "correct": perturbed["perturbed_correct"].astype(bool).to_numpy(),
                    "seen": perturbed["seen"].astype(bool).to_numpy(),
                }
            ),
        )
        out.setdefault(strategy, []).append(evaluated)
    return out


def shipped(root: Path, tie_break: str | None = None) -> tuple[list[str], list[str]]:
    """Per seed: the strategy whose winner export's selection (with `tie_break`, default export's own) chooses among
    that seed's winners, and why."""
    candidates = compare_candidates(root)
    chosen, why = [], []
    for seed in sorted(set(candidates["seed"])):
        row, how, _ = select_by_dev(candidates[candidates["seed"] == seed].reset_index(drop=True), tie_break=tie_break)
        chosen.append(str(row["strategy"]))
        why.append(how)
    return chosen, why


def analyse(root: Path, seed: int = 1234) -> dict:
    """`seed`: the compare's --seed (its paired bootstrap's seed; the CLI's default 1234)."""
    entries = evaluations(root)
    n_seeds = max(len(v) for v in entries.values())
    searched = {k: v for k, v in entries.items() if k != "baseline"}

    # the reconstruction is the compare's own input: re-pair one pair it paired and compare
    recorded = pd.read_csv(root / "compare_paired.csv")
    a, b = "accuracy", "tcb@pmi" if "tcb@pmi" in searched else "ppl"
    again = paired_table({a: searched[a], b: searched[b]}, seed=seed).iloc[0]
    want = recorded[(recorded["a"] == a) & (recorded["b"] == b)].iloc[0]
    for column in COLUMNS:
        if abs(float(again[column]) - float(want[column])) > 1e-12:
            raise SystemExit(f"{root}: re-paired {a} − {b} {column} {again[column]} != compare's {want[column]}")

    out = {"task": root.name}
    # export's selection today (argmax first within the dev tie set), and by stability alone (before 2026-12-05)
    for label, tie_break in (("shipped", None), ("shipped_by_stability", "stability")):
        choice, why = shipped(root, tie_break)
        ship = [searched[strategy][s] for s, strategy in enumerate(choice)]
        assert len(ship) == n_seeds
        pairs = paired_table({label: ship, "accuracy": searched["accuracy"]}, seed=seed).iloc[0]
        out[f"{label}_per_seed"], out[f"{label}_why"] = choice, why
        out.update({f"{label}_minus_accuracy_{c}": float(pairs[c]) for c in COLUMNS})
    for other in ("ppl", "accuracy"):
        if "tcb@pmi" in searched and other in searched:
            row = recorded[(recorded["a"] == other) & (recorded["b"] == "tcb@pmi")]
            sign = -1.0  # the table holds other − tcb@pmi; report tcb@pmi − other
            if row.empty:
                row, sign = recorded[(recorded["a"] == "tcb@pmi") & (recorded["b"] == other)], 1.0
            r = row.iloc[0]
            lo, hi = sorted((sign * r["delta_acc_worst_unseen_ci_low"], sign * r["delta_acc_worst_unseen_ci_high"]))
            out[f"tcb@pmi_minus_{other}_acc_worst_unseen"] = (sign * float(r["delta_acc_worst_unseen"]), lo, hi)
            lo, hi = sorted((sign * r["delta_acc_ci_low"], sign * r["delta_acc_ci_high"]))
            out[f"tcb@pmi_minus_{other}_acc"] = (sign * float(r["delta_acc"]), lo, hi, float(r["mcnemar_p"]))
    return out


def main(argv: list[str]) -> int:
    seed = 1234
    if argv[:1] == ["--seed"]:
        seed, argv = int(argv[1]), argv[2:]
    for arg in argv:
        result = analyse(Path(arg), seed)
        print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
