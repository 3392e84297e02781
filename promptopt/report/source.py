"""What a run directory holds, read once and only read: the report draws what the run wrote.

Kinds: a `compare` directory (compare.csv, compare_paired.csv, compare_runs.csv, one search folder per
strategy, or per strategy and seed), a `search` run (config.json), `search --rounds` (rounds.json, one search
run per round), an `evaluate` output (a family table
.csv with its .json, or robustness_items.parquet), a `stress` sweep (sweep_summary), or `diagnose proxy`
tables alone. Tables found beside a run are picked up by their columns, not their names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from promptopt.errors import UserError
from promptopt.study.tableset import check_table_set
from promptopt.workflows.export import Run, load_study, open_run
from promptopt.workflows.export.runs import read_json
from promptopt.workflows.export.select import is_compare_dir

FAMILY_COLUMNS = {"family", "acc_clean_same_items", "acc_perturbed"}
TABOO_COLUMNS = {"rank", "retention", "retention_ci_low", "retention_ci_high"}
ITEMS_FILE = "robustness_items.parquet"
_OWN_TABLES = {
    "compare.csv",
    "compare_runs.csv",
    "compare_paired.csv",
    "trials.csv",
    "best_test_items.csv",
    "proxy_prompts.csv",
    "proxy_correlations.csv",
    "sweep_summary.csv",
}


@dataclass
class Study:
    """One search of the run: its strategy, seed (0 for a single-seed compare or a search) and Optuna study."""

    strategy: str
    seed: int
    run: Run
    study: object


@dataclass
class Source:
    root: Path
    kind: str  # compare | search | evaluate | sweep | proxy
    studies: list[Study] = field(default_factory=list)
    compare: pd.DataFrame | None = None  # compare.csv: one row per strategy (mean over seeds) and the baseline
    paired: pd.DataFrame | None = None  # compare_paired.csv: one row per pair of strategies
    candidates: pd.DataFrame | None = None  # compare_runs.csv: every evaluated (strategy, seed, rank)
    summary: dict = field(default_factory=dict)  # compare's summary.json
    items: pd.DataFrame | None = None  # robustness_items.parquet: one row per (strategy, seed, item, family, variant)
    families: list[tuple[Path, pd.DataFrame, dict]] = field(default_factory=list)  # evaluate tables and their .json
    taboo: list[tuple[Path, pd.DataFrame]] = field(default_factory=list)
    proxy: pd.DataFrame | None = None
    auroc: pd.DataFrame | None = None
    sweep: pd.DataFrame | None = None
    sweep_figures: list[Path] = field(default_factory=list)

    @property
    def strategies(self) -> list[str]:
        return list(dict.fromkeys(s.strategy for s in self.studies))

    @property
    def seeds(self) -> int:
        return int(self.summary.get("seeds") or 1)

    @property
    def config(self):
        """The first search's settings (task, model), when the run has a search."""
        return self.studies[0].run.config if self.studies else None


def is_ensemble_entry(name: str) -> bool:
    return re.search(r"\+ens\d+$", name) is not None


def _seed_of(path: Path) -> int:
    found = re.fullmatch(r"seed(\d+)", path.name)
    return int(found.group(1)) if found else 0


def _searches(root: Path, strategies: list[str]) -> list[Study]:
    studies = []
    for name in strategies:
        folder = root / name
        folders = (
            [folder]
            if (folder / "config.json").is_file()
            else sorted((d for d in folder.glob("seed*") if (d / "config.json").is_file()), key=_seed_of)
        )
        if not folders:
            raise UserError(f"{folder}: no search run for strategy {name} (config.json missing)")
        for path in folders:
            run = open_run(path)
            studies.append(Study(name, _seed_of(path), run, load_study(run)))
    return studies


def _header(path: Path) -> set[str]:
    try:
        return set(pd.read_csv(path, nrows=0).columns)
    except (ValueError, OSError, pd.errors.ParserError):
        return set()


def _read_given(path: Path, needed: set[str], flag: str) -> pd.DataFrame:
    if not path.is_file():
        raise UserError(f"{flag} {path}: file not found")
    frame = pd.read_csv(path)
    missing = needed - set(frame.columns)
    if missing:
        command = "evaluate" if flag == "--robustness" else "stress"
        raise UserError(
            f"{flag} {path}: missing column {sorted(missing)[0]} (expected the table `promptopt {command} --out` writes)"
        )
    return frame


def _sidecar(path: Path) -> dict:
    """The .json summary `evaluate --out` writes beside its family table."""
    side = path.with_suffix(".json")
    try:
        return json.loads(side.read_text(encoding="utf-8")) if side.is_file() else {}
    except (json.JSONDecodeError, OSError):
        return {}


def read_source(run_dir: str | Path, *, robustness: list[Path] = (), taboo: list[Path] = ()) -> Source:
    root = Path(run_dir)
    if not root.is_dir():
        raise UserError(f"{root}: no such run directory")
    source = _by_kind(root)
    folders = list(
        dict.fromkeys([root, *(s.run.path for s in source.studies), *(s.run.path.parent for s in source.studies)])
    )
    given = {Path(p).resolve() for p in (*robustness, *taboo)}
    source.families = [
        (Path(p), _read_given(Path(p), FAMILY_COLUMNS, "--robustness"), _sidecar(Path(p))) for p in robustness
    ]
    source.taboo = [(Path(p), _read_given(Path(p), TABOO_COLUMNS, "--taboo")) for p in taboo]
    for folder in folders:
        for path in sorted(folder.glob("*.csv")):
            if path.name in _OWN_TABLES or path.resolve() in given:
                continue
            columns = _header(path)
            if FAMILY_COLUMNS <= columns:
                source.families.append((path, pd.read_csv(path), _sidecar(path)))
            elif TABOO_COLUMNS <= columns and not {"model", "task"} <= columns:
                source.taboo.append((path, pd.read_csv(path)))
            elif "auroc" in path.name.lower() and source.auroc is None:
                source.auroc = pd.read_csv(path)
        if source.items is None and (folder / ITEMS_FILE).is_file():
            source.items = pd.read_parquet(folder / ITEMS_FILE)
        if source.proxy is None and (folder / "proxy_correlations.csv").is_file():
            source.proxy = pd.read_csv(folder / "proxy_correlations.csv")
    if (root / "sweep_summary.csv").is_file():
        source.sweep = pd.read_csv(root / "sweep_summary.csv")
        source.sweep_figures = sorted(root.glob("figure*.png"))
    return source


def _by_kind(root: Path) -> Source:
    if is_compare_dir(root):  # its tables only as a complete set (each search's are checked by open_run)
        check_table_set(root, "compare")
        compare = pd.read_csv(root / "compare.csv")
        # the searches: every entry but the baseline and the ensembles (`<entry>+ens<K>`: built from an entry's
        # trials, no study of their own; their rows stay in the compare's tables)
        strategies = [s for s in compare["strategy"] if s != "baseline" and not is_ensemble_entry(str(s))]
        summary = read_json(root / "summary.json", missing={})
        paired = pd.read_csv(root / "compare_paired.csv") if (root / "compare_paired.csv").is_file() else None
        candidates = pd.read_csv(root / "compare_runs.csv") if (root / "compare_runs.csv").is_file() else None
        return Source(
            root,
            "compare",
            _searches(root, strategies),
            compare=compare,
            paired=paired,
            candidates=candidates,
            summary=summary,
        )
    if (root / "rounds.json").is_file():  # search --rounds: one study per round, each its own run directory
        rounds = read_json(root / "rounds.json")
        studies = []
        for entry in rounds.get("rounds") or []:
            run = open_run(root / f"round{entry['round']}")
            studies.append(Study(f"round{entry['round']}", 0, run, load_study(run)))
        return Source(root, "rounds", studies, summary=rounds)
    if (root / "config.json").is_file():
        run = open_run(root)
        return Source(root, "search", [Study(run.config.study.strategy, 0, run, load_study(run))])
    if (root / "sweep_summary.csv").is_file():
        return Source(root, "sweep")
    if (root / ITEMS_FILE).is_file() or any(FAMILY_COLUMNS <= _header(p) for p in root.glob("*.csv")):
        return Source(root, "evaluate")
    if (root / "proxy_correlations.csv").is_file():
        return Source(root, "proxy")
    raise UserError(
        f"{root}: not a run directory (no config.json), a compare directory (no compare.csv), "
        "an `evaluate --out` folder (no family table) nor a `stress` sweep (no sweep_summary.csv)"
    )
