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

from promptopt.analyses.diagnose.output import new_figure, save_figure
from promptopt.errors import UserError
from promptopt.yamlio import atomic_write_bytes_via, atomic_write_text, check_output
from promptopt.yamlio import write_parquet_and_csv as save_table


@dataclass(frozen=True, kw_only=True)
class SweepSettings:
    """What defines every condition's result: a resumed sweep must keep all of these (each cell also records
    its model weights, task file, items and prompt in `cell.json`)."""

    protocol: str | None  # protocol name (None: each task's own prompt and decoding settings)
    protocol_sha256: str | None
    ranks: tuple[int, ...]
    mode: str
    temperature: float
    seed: int
    split: str
    limit: int | None
    dtype: str  # resolved: float32 on CPU, bfloat16 on GPU unless given
    device_type: str
    quantize: str | None
    batch_size: int
    subsets: tuple[str, ...] | None


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
    """A folder name for a model spec: its last part, readable, plus a hash of the whole spec (a local path
    resolved), so 'a/b_c' and 'a_b/c', or two folders that share a name, never share results."""
    path = Path(name)
    full = str(path.resolve()) if path.exists() else name
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", full.rstrip("/").split("/")[-1]).strip("_") or "model"
    return f"{readable}-{hashlib.sha256(full.encode()).hexdigest()[:8]}"


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
                raise UserError(
                    f"{out}: holds a sweep with {key} = {stored.get(key)!r}, this run has {value!r}; "
                    "use another --out (finished conditions are reused only under the same settings)"
                )
    else:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(current, indent=1))


def run_stress_sweep(
    *,
    models: list[str],
    tasks: list[str],
    settings: SweepSettings,
    out: Path,
    protocol=None,
    device: str = "auto",
    progress: bool = True,
    log=print,
    trust_task_code: bool = False,
) -> SweepResult:
    """`protocol`: the loaded StressProtocol that `settings.protocol` names (None: each task's own settings)."""
    from promptopt.models import ModelConfig
    from promptopt.tasks import DataConfig

    start = time.perf_counter()
    if not models or not tasks:
        raise UserError(f"--{'models' if not models else 'tasks'}: expected a comma-separated list, got nothing")
    folders = [slug(m) for m in models]
    for label, names in (("--models", folders), ("--tasks", tasks)):
        if len(set(names)) < len(names):
            twice = next(n for n in names if names.count(n) > 1)
            raise UserError(f"{label}: {models[folders.index(twice)] if label == '--models' else twice} is given twice")
    if (protocol.name if protocol else None) != settings.protocol:
        raise ValueError("settings.protocol must name the protocol passed in")
    prepared = {}
    for task in tasks:  # every task and protocol problem is reported before a model loads
        data = DataConfig(task=task, subsets=settings.subsets, trust_task_code=trust_task_code)
        if protocol is not None:
            prepared[task] = protocol.apply(data, limit=settings.limit)
        else:
            loaded = data.load()
            if not loaded.spec.generative:
                raise UserError(
                    f"--tasks: {task} is scored by log-likelihood; taboo stress needs a generative task"
                    + (" (use mmlu_gen)" if task == "mmlu" else "")
                )
            prepared[task] = (loaded, loaded.default_prompt(), loaded.split(settings.split)[: settings.limit])
    check_settings(out, settings)
    frames, decoded, reused = [], 0, 0
    for model, folder in zip(models, folders):
        config = ModelConfig(spec=model, device=device, dtype=settings.dtype, quantize=settings.quantize)
        model_frames, model_decoded, model_reused = _sweep_model(
            config, folder, tasks, prepared, settings, out, progress, log
        )
        frames += model_frames
        decoded, reused = decoded + model_decoded, reused + model_reused
        gc.collect()  # the model and its scorers went out of scope with _sweep_model: free them before the next
        _empty_cuda_cache()
    summary = pd.concat(frames, ignore_index=True)
    summary = summary[["model", "task", *[c for c in summary.columns if c not in ("model", "task")]]]
    written = save_table(summary, out / "sweep_summary")
    written += [
        plot_retention(summary, out / "figure1_retention.png"),
        plot_dose(summary, "accuracy", out / "figure3_accuracy.png"),
        plot_dose(summary, "length_expansion", out / "figure8_length.png"),
    ]
    return SweepResult(summary, written, decoded, reused, time.perf_counter() - start)


def _cell_identity(model: str, weights: dict, data, prompt, items) -> dict:
    """What a cell's conditions were computed from, beyond the sweep's settings."""
    from promptopt.tasks.item import items_sha256
    from promptopt.workflows.fingerprint import sha256_json, task_sha256, versions

    return {
        "model": model,
        "weights_sha256": weights["weights_sha256"],
        "task": data.spec.name,
        "task_sha256": task_sha256(data.spec),
        "prompt_sha256": sha256_json(prompt.to_card()),
        "items_sha256": items_sha256(items),
        "promptopt": versions().get("promptopt"),
    }


def _check_cell(store: ConditionFolder, identity: dict) -> None:
    """A cell's finished conditions count only for the same model weights, task file, prompt and items."""
    path = store.folder / "cell.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        for key, value in identity.items():
            if key != "promptopt" and stored.get(key) != value:
                raise UserError(
                    f"{store.folder}: its conditions were computed with another {key.replace('_sha256', '')} "
                    f"({str(stored.get(key))[:16]} vs {str(value)[:16]}); use another --out"
                )
    else:
        store.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(identity, indent=1))


def _sweep_model(config, folder: str, tasks, prepared, settings: SweepSettings, out: Path, progress: bool, log):
    """One model's cells. The model is loaded only if a condition is missing, and lives only in this call."""
    from promptopt.robustness import taboo_stress
    from promptopt.scoring import Scorer
    from promptopt.workflows.fingerprint import model_fingerprint

    weights = model_fingerprint(config.spec)
    cells = {task: ConditionFolder(out / "cells" / folder / task) for task in tasks}
    wanted = (0, *settings.ranks)
    for task in tasks:
        _check_cell(cells[task], _cell_identity(config.spec, weights, *prepared[task]))
    missing = any(r not in cells[t] for t in tasks for r in wanted)
    if missing:
        log(f"loading {config.spec}")
    lm = config.load() if missing else None
    frames, decoded, reused = [], 0, 0
    for task in tasks:
        data, prompt, items = prepared[task]
        store = cells[task]
        before = sum(r in store for r in wanted)
        if lm is None:
            result = _from_store(store, items, settings)
        else:
            scorer = Scorer(lm, data, batch_size=settings.batch_size, progress=progress)
            result = taboo_stress(
                scorer,
                prompt,
                items,
                ranks=settings.ranks,
                mode=settings.mode,
                temperature=settings.temperature,
                seed=settings.seed,
                store=store,
            )
        reused, decoded = reused + before, decoded + len(wanted) - before
        frames.append(result.summary.assign(model=config.spec, task=task))
        log(f"{config.spec} · {task}: {before} condition(s) reused, {len(wanted) - before} decoded")
    return frames, decoded, reused


def _from_store(store: ConditionFolder, items, settings: SweepSettings):
    """The cell's summary from finished conditions alone (the same numbers taboo_stress computes)."""
    from promptopt.robustness.stress import StressResult, condition_summary

    ids = [item.id for item in items]
    frames = {r: store[r] for r in (0, *settings.ranks)}
    for rank, frame in frames.items():
        if frame["item_id"].astype(str).tolist() != ids:
            raise UserError(f"{store._path(rank)}: its items differ from this run's; use another --out")
    base = frames[0]
    base_correct = base["correct"].to_numpy()
    rows = [condition_summary(r, frames[r], base_correct, base) for r in (0, *settings.ranks)]
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
    return rows.pivot(index="model", columns="rank", values="retention").reindex(
        index=list(dict.fromkeys(rows["model"]))
    )


def plot_retention(summary: pd.DataFrame, path: Path) -> Path:
    import matplotlib
    import numpy as np

    tasks = list(dict.fromkeys(summary["task"]))
    fig, axes = new_figure(
        len(tasks), size=(3.2 + 1.2 * len(set(summary["rank"])) * len(tasks), 1.6 + 0.5 * summary["model"].nunique())
    )
    for ax, task in zip(axes[0], tasks):
        grid = retention_grid(summary, task)
        values = grid.to_numpy(dtype=float) * 100
        cmap = matplotlib.colormaps["viridis"].copy()
        cmap.set_bad("lightgrey")  # undefined (no baseline-correct item) must not look like 0%
        ax.imshow(np.ma.masked_invalid(values), vmin=0, vmax=100, cmap=cmap, aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [f"i={r}" for r in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [_label(m) for m in grid.index])
        for (r, c), v in np.ndenumerate(values):
            ax.text(
                c,
                r,
                "—" if np.isnan(v) else f"{v:.0f}%",
                ha="center",
                va="center",
                color="white" if v < 60 else "black",
                fontsize=9,
            )
        ax.set_title(f"{task}: retention")
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


def sweep_from_options(
    *,
    tasks: list[str],
    models: list[str],
    protocol,
    ranks,
    mode: str,
    temperature: float,
    seed: int,
    split: str,
    limit: int | None,
    out: Path,
    subsets,
    device: str,
    dtype,
    quantize,
    batch_size: int | str,
    log=print,
    trust_task_code: bool = False,
):
    """`promptopt stress --models/--tasks`: the taboo paper's sweep, every condition kept in `out` (resumable)."""
    from promptopt.models import ModelConfig

    if not tasks:
        raise UserError("a sweep needs --tasks (comma-separated generative tasks)")
    check_output(out, folder=True, what="--out")
    probe = ModelConfig(spec=models[0] if models else "x", device=device, dtype=dtype, quantize=quantize)
    settings = SweepSettings(
        protocol=protocol.name if protocol else None,
        protocol_sha256=protocol.digest if protocol else None,
        ranks=tuple(ranks),
        mode=mode,
        temperature=temperature,
        seed=seed,
        split=split,
        limit=limit,
        dtype=probe.resolved_dtype(),
        device_type=probe.resolved_device_type(),
        quantize=quantize,
        batch_size=batch_size,
        subsets=subsets,
    )
    return run_stress_sweep(
        models=models,
        tasks=tasks,
        settings=settings,
        out=out,
        protocol=protocol,
        device=device,
        log=log,
        trust_task_code=trust_task_code,
    )
