"""`promptopt stress --models A,B --tasks gsm8k,mmlu_gen,triviaqa --ranks 1,2,4,8`: the Taboo paper's sweep.

Every (model, task) cell is a taboo stress (robustness/stress.py) on the same items for every model —
the protocol's seeded subsample — and every condition of a cell (baseline, then each rank) is written to
`OUT/cells/<model>/<task>/rank_<i>.parquet` the moment it finishes, so a sweep resumed after a crash (or
extended with more models or tasks) decodes only what is missing. `OUT/sweep.json` records the settings
that define a condition; a different setting on the same OUT is refused instead of mixed in.

Outputs, as tables (Parquet + CSV) and figures (PNG):
- `sweep_summary`: one row per (model, task, rank) with every stress metric (rank 0 = baseline);
- Figure 1 (`figure1_retention.png`): conditional retention heatmap, models × ranks, one panel per task
  (the table carries the 95% Wilson interval of each cell);
- Figure 3 (`figure3_accuracy.png`): absolute accuracy vs dose (baseline, then each rank) per model;
- Figure 8 (`figure8_length.png`): answer-length expansion (mean generated tokens / baseline) vs dose.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
import time
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from promptopt.errors import UserError
from promptopt.experiments.diagnose.output import new_figure, save_figure, save_table
from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    """What defines a condition's result: a resumed sweep must keep all of these."""

    protocol: str | None  # protocol name (None: each task's own prompt and decoding settings)
    protocol_sha256: str | None
    ranks: tuple[int, ...]
    mode: str
    temperature: float
    seed: int
    split: str
    limit: int | None
    dtype: str | None
    quantize: str | None


class ConditionFolder(MutableMapping):
    """rank -> per-item rows of one cell, one Parquet file per condition, written atomically."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, rank: int) -> Path:
        return self.folder / f"rank_{int(rank)}.parquet"

    def __getitem__(self, rank: int) -> pd.DataFrame:
        path = self._path(rank)
        if not path.is_file():
            raise KeyError(rank)
        return pd.read_parquet(path)

    def __setitem__(self, rank: int, frame: pd.DataFrame) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        table = frame.copy()
        table["pred"] = table["pred"].map(str)  # extracted answers mix numbers and text
        atomic_write_bytes_via(self._path(rank), lambda p: table.to_parquet(p, index=False))

    def __contains__(self, rank) -> bool:
        return self._path(rank).is_file()

    def __delitem__(self, rank: int) -> None:
        self._path(rank).unlink()

    def __iter__(self):
        return (int(p.stem.split("_", 1)[1]) for p in sorted(self.folder.glob("rank_*.parquet")))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def slug(name: str) -> str:
    """A folder name for a model spec: a hub id or embedded name as it reads; a local path by its last part
    plus a hash of the resolved path, so two folders that share a name never share results."""
    path = Path(name)
    if path.exists():
        resolved = str(path.resolve())
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', path.resolve().name)}-{hashlib.sha256(resolved.encode()).hexdigest()[:8]}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


@dataclass
class SweepResult:
    summary: pd.DataFrame  # one row per (model, task, rank)
    written: list[Path]
    decoded: int  # conditions decoded in this run
    reused: int  # conditions found finished on disk
    seconds: float


def check_settings(out: Path, settings: SweepSettings) -> None:
    """A sweep folder holds one setting: refuse another, naming the field, before any model loads."""
    path = out / "sweep.json"
    current = json.loads(json.dumps(asdict(settings)))
    if path.is_file():
        stored = json.loads(path.read_text())
        for key, value in current.items():
            if stored.get(key) != value:
                raise UserError(f"{out}: holds a sweep with {key} = {stored.get(key)!r}, this run has {value!r}; "
                                "use another --out (finished conditions are reused only under the same settings)")
    else:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(current, indent=1))


def run_stress_sweep(*, models: list[str], tasks: list[str], settings: SweepSettings, out: Path, device: str = "auto",
                     batch_size: int = 16, subsets=None, progress: bool = True, log=print) -> SweepResult:
    from promptopt.models import ModelConfig
    from promptopt.robustness import taboo_stress
    from promptopt.robustness.protocol import load_protocol
    from promptopt.scoring import Scorer
    from promptopt.tasks import DataConfig

    start = time.perf_counter()
    folders = [slug(m) for m in models]
    if len(set(folders)) < len(folders):
        twice = next(m for m, f in zip(models, folders) if folders.count(f) > 1)
        raise UserError(f"--models: {twice} is given twice")
    if len(set(tasks)) < len(tasks):
        raise UserError(f"--tasks: {next(t for t in tasks if tasks.count(t) > 1)} is given twice")
    protocol = load_protocol(settings.protocol) if settings.protocol else None
    prepared = {}
    for task in tasks:  # every task and protocol problem is reported before a model loads
        data = DataConfig(task=task, subsets=subsets).load()
        if protocol is not None:
            prepared[task] = protocol.apply(data, limit=settings.limit)
        else:
            if not data.spec.generative:
                raise UserError(f"--tasks: {task} is scored by log-likelihood; taboo stress needs a generative task"
                                + (" (use mmlu_gen)" if task == "mmlu" else ""))
            prepared[task] = (data, data.default_prompt(), data.split(settings.split)[: settings.limit])
    check_settings(out, settings)
    configs = [ModelConfig(spec=m, device=device, dtype=settings.dtype, quantize=settings.quantize) for m in models]
    frames, decoded, reused = [], 0, 0
    for model, folder, config in zip(models, folders, configs):
        cells = {task: ConditionFolder(out / "cells" / folder / task) for task in tasks}
        wanted = (0, *settings.ranks)
        if all(all(r in cells[t] for r in wanted) for t in tasks):
            lm = None  # every condition of this model is on disk: no need to load it
        else:
            log(f"loading {model}")
            lm = config.load()
        for task in tasks:
            data, prompt, items = prepared[task]
            store = cells[task]
            before = {r for r in wanted if r in store}
            if lm is None:
                result = _from_store(store, items, settings)
            else:
                scorer = Scorer(lm, data, batch_size=batch_size, progress=progress)
                result = taboo_stress(scorer, prompt, items, ranks=settings.ranks, mode=settings.mode,
                                      temperature=settings.temperature, seed=settings.seed, store=store)
            reused += len(before)
            decoded += len(wanted) - len(before)
            frames.append(result.summary.assign(model=model, task=task))
            log(f"{model} · {task}: {len(before)} condition(s) reused, {len(wanted) - len(before)} decoded")
        del lm
        gc.collect()
        _empty_cuda_cache()
    summary = pd.concat(frames, ignore_index=True)
    summary = summary[["model", "task", *[c for c in summary.columns if c not in ("model", "task")]]]
    written = save_table(summary, out / "sweep_summary")
    written += [plot_retention(summary, out / "figure1_retention.png"), plot_dose(summary, "accuracy", out / "figure3_accuracy.png"),
                plot_dose(summary, "length_expansion", out / "figure8_length.png")]
    return SweepResult(summary, written, decoded, reused, time.perf_counter() - start)


def _from_store(store: ConditionFolder, items, settings: SweepSettings):
    """The cell's summary from finished conditions alone (the same numbers taboo_stress computes)."""
    from promptopt.robustness.stress import StressResult, condition_summary

    ids = [item.id for item in items]
    base = store[0]
    if base["item_id"].astype(str).tolist() != ids:
        raise UserError(f"{store.folder}: its items differ from this run's; use another --out")
    base_correct = base["correct"].to_numpy()
    rows = [condition_summary(0, base, base_correct, base)]
    rows += [condition_summary(r, store[r], base_correct, base) for r in settings.ranks]
    return StressResult(pd.DataFrame(rows), pd.DataFrame())


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _label(model: str) -> str:
    """A model's short name on a figure (the tables keep the full spec)."""
    return str(model).rstrip("/").split("/")[-1]


def retention_grid(summary: pd.DataFrame, task: str) -> pd.DataFrame:
    """Models × ranks of conditional retention for one task (the numbers in Figure 1)."""
    rows = summary[(summary["task"] == task) & (summary["rank"] > 0)]
    return rows.pivot(index="model", columns="rank", values="retention").reindex(index=list(dict.fromkeys(rows["model"])))


def plot_retention(summary: pd.DataFrame, path: Path) -> Path:
    import numpy as np

    tasks = list(dict.fromkeys(summary["task"]))
    fig, axes = new_figure(len(tasks), size=(3.2 + 1.2 * len(set(summary["rank"])) * len(tasks), 1.6 + 0.5 * summary["model"].nunique()))
    for ax, task in zip(axes[0], tasks):
        grid = retention_grid(summary, task)
        values = grid.to_numpy(dtype=float) * 100
        ax.imshow(np.nan_to_num(values, nan=0.0), vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [f"i={r}" for r in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [_label(m) for m in grid.index])
        for (r, c), v in np.ndenumerate(values):
            ax.text(c, r, "—" if np.isnan(v) else f"{v:.0f}%", ha="center", va="center", color="white" if v < 60 else "black", fontsize=9)
        ax.set_title(f"{task}: conditional retention")
    return save_figure(fig, path)


def plot_dose(summary: pd.DataFrame, column: str, path: Path) -> Path:
    tasks = list(dict.fromkeys(summary["task"]))
    fig, axes = new_figure(len(tasks))
    label = {"accuracy": "accuracy", "length_expansion": "length expansion (× baseline)"}[column]
    for ax, task in zip(axes[0], tasks):
        rows = summary[summary["task"] == task]
        for model, part in rows.groupby("model", sort=False):
            part = part.sort_values("rank")
            ax.plot(range(len(part)), part[column], marker="o", label=_label(model))
            ax.set_xticks(range(len(part)), ["base" if r == 0 else f"i={r}" for r in part["rank"]])
        ax.set_title(f"{task}: {label} vs taboo dose")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    return save_figure(fig, path)
