"""Two compare directories paired item by item: did what differs between them (a space grown by
`--propose`, another model, another budget) change what each strategy's winners do?

Pairs are the same strategy and seed in both runs, on the same test items (checked: the runs must have
scored the same items in the same order, and judged robustness on the same families). The numbers are the
compare's own: Δ accuracy with the item-clustered paired bootstrap interval and the exact McNemar p-value,
Δ Acc_worst and Δ PDR over all judged families and over the unseen ones (`workflows.compare`), all read
from what each compare wrote (`test_items.parquet`, every winner's test answers, whichever trial won; and
`robustness_items.parquet`); nothing is scored again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from promptopt.errors import UserError
from promptopt.study.tableset import check_table_set
from promptopt.workflows.compare import ITEMS_FILE, TEST_ITEMS_FILE, Evaluated, paired_table
from promptopt.workflows.export.select import is_compare_dir
from promptopt.yamlio import check_out_files, check_table_path, write_table


def _winners(root: Path) -> tuple[dict[str, list[Evaluated]], dict]:
    """strategy -> its winners' evaluations, seed by seed, rebuilt from a finished compare's files (a complete
    table set: study/tableset.py)."""
    if is_compare_dir(root):
        check_table_set(root, "compare")
    for name in ("compare_runs.csv", "summary.json"):
        if not (root / name).is_file():
            raise UserError(f"{root}: not a finished compare directory (no {name})")
    summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    runs = pd.read_csv(root / "compare_runs.csv")
    items = pd.read_parquet(root / ITEMS_FILE) if (root / ITEMS_FILE).is_file() else None
    tests = pd.read_parquet(root / TEST_ITEMS_FILE) if (root / TEST_ITEMS_FILE).is_file() else None
    robust = {
        "families_unseen": summary.get("families_unseen") or [],
        "families_seen": summary.get("families_seen") or [],
    }
    winners: dict[str, list[Evaluated]] = {}
    for _, row in (
        runs[runs["winner"].astype(bool) & (runs["strategy"] != "baseline")]
        .sort_values(["strategy", "seed"])
        .iterrows()
    ):
        strategy, seed = str(row["strategy"]), int(row["seed"])
        if tests is not None:  # every winner's answers, whichever trial won
            mine = tests[(tests["strategy"] == strategy) & (tests["seed"] == seed)]
            if mine.empty:
                raise UserError(f"{root}: {TEST_ITEMS_FILE} has no answers of {strategy} seed {seed}")
            ev = Evaluated(mine.drop(columns=["strategy", "seed"]).reset_index(drop=True), robust=dict(robust))
        else:
            ev = _best_trial_answers(root, summary, row, robust)
        if items is not None:
            mine = items[(items["strategy"] == row["strategy"]) & (items["seed"] == row["seed"])]
            clean = mine[mine["family"].isna()]
            ev.clean = clean.set_index("item_id")["clean_correct"].astype(bool).rename("correct")
            perturbed = mine[mine["family"].notna()]
            ev.variants = pd.DataFrame(
                {
                    "item_id": perturbed["item_id"],
                    "family": perturbed["family"],
                    "correct": perturbed["perturbed_correct"].astype(bool),
                    "seen": perturbed["seen"].astype(bool),
                }
            )
        ev.robust["dev_accuracy"] = float(row["dev_accuracy"]) if pd.notna(row.get("dev_accuracy")) else float("nan")
        winners.setdefault(str(row["strategy"]), []).append(ev)
    return winners, summary


def _best_trial_answers(root: Path, summary: dict, row, robust: dict) -> Evaluated:
    """A compare from before test_items.parquet: the test table of its run directory's best trial, which is the
    winner's only when the search's own rule chose it (`--select robust` may choose another)."""
    strategy, seed = str(row["strategy"]), int(row["seed"])
    run_dir = (
        root / strategy / f"seed{seed}" if int(summary.get("seeds") or 1) > 1 else root / strategy
    )  # compare's layout
    table = run_dir / "best_test_items.parquet"
    if not table.is_file() or not (run_dir / "summary.json").is_file():
        raise UserError(f"{root}: {table} is missing (the compare's run directory of {strategy} seed {seed})")
    best = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("best_trial")
    if pd.notna(row.get("trial")) and int(row["trial"]) != best:
        raise UserError(
            f"{root}: the winner of {strategy} seed {seed} is trial {int(row['trial'])}, not its search's best "
            f"trial {best}, and this compare predates {TEST_ITEMS_FILE}, which keeps every winner's answers: "
            f"a compare made now writes it"
        )
    return Evaluated(pd.read_parquet(table), robust=dict(robust))


def pair_runs(a: str | Path, b: str | Path, *, seed: int = 0) -> pd.DataFrame:
    """One row per strategy both runs searched: run a − run b, paired by seed and item."""
    (wa, sa), (wb, sb) = _winners(Path(a)), _winners(Path(b))
    shared = [name for name in wa if name in wb]
    if not shared:
        raise UserError(f"{a} and {b} share no strategy to pair")
    if ((Path(a) / ITEMS_FILE).is_file()) != ((Path(b) / ITEMS_FILE).is_file()):
        raise UserError(f"only one of {a} and {b} judged robustness ({ITEMS_FILE}): compare both with the same --suite")
    for key in ("families_unseen", "families_seen", "n_robust", "task", "model"):
        if sa.get(key) != sb.get(key):
            raise UserError(
                f"{a} and {b} differ in {key} ({sa.get(key)!r} vs {sb.get(key)!r}): their items do not pair"
            )
    rows = []
    for name in shared:
        if len(wa[name]) != len(wb[name]):
            raise UserError(f"strategy {name}: {len(wa[name])} seeds in {a} but {len(wb[name])} in {b}")
        for ea, eb in zip(wa[name], wb[name]):
            if list(ea.test["item_id"]) != list(eb.test["item_id"]):
                raise UserError(f"strategy {name}: the runs scored different test items; pairing needs the same ones")
        paired = paired_table({"a": wa[name], "b": wb[name]}, seed=seed)
        accuracy = {
            run: float(pd.concat([ev.test["correct"] for ev in w[name]]).mean()) for run, w in (("a", wa), ("b", wb))
        }
        dev = {
            run: float(pd.Series([ev.robust["dev_accuracy"] for ev in w[name]]).mean())
            for run, w in (("a", wa), ("b", wb))
        }
        rows.append(
            {
                "strategy": name,
                "seeds": len(wa[name]),
                "dev_accuracy_a": dev["a"],
                "dev_accuracy_b": dev["b"],
                "accuracy_a": accuracy["a"],
                "accuracy_b": accuracy["b"],
                **paired.drop(columns=["a", "b"]).iloc[0].to_dict(),
            }
        )
    return pd.DataFrame(rows)


def pair_to_file(run_a: Path, run_b: Path, out: Path | None):
    """`promptopt pair`: two compares paired item by item (workflows.pair_runs); the table goes to `out` too."""
    if out is not None:
        check_table_path(out)
        check_out_files(out)
    table = pair_runs(run_a, run_b)
    if out is not None:
        write_table(table, out)
    return table
