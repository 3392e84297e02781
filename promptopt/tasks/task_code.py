"""A task file's own Python: lm-evaluation-harness's `!function module.name` hooks, run only when trusted.

A task YAML may name a Python function (`doc_to_text: !function preprocess_winogrande.doc_to_text`,
`process_docs: !function utils.process_docs`), as lm-eval's task files do. Reading the file never runs it: the
tag becomes a `FunctionRef`. Only with `trust_task_code` (the CLI's `--trust-task-code`) is the module imported,
from the task file's own folder and nowhere else (not from `sys.path`, unlike lm-eval, which falls back to any
importable module), and its function called on each row in this process, with this process's rights. Without
it, a hook is one error line naming the flag. See docs/guarantees.md (Task code).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from promptopt.errors import ConfigError
from promptopt.yaml_bounds import BoundedSafeLoader
from promptopt.yamlio import read_yaml_text, yaml_problem

TRUST_FLAG = "--trust-task-code"


@dataclass(frozen=True)
class FunctionRef:
    """`!function module.name` as read from a task file, not yet imported."""

    name: str
    folder: Path  # the task file's folder: the only place the module is looked for
    where: str  # the task file


@dataclass(frozen=True)
class TaskFunction:
    """A trusted, imported task function; `call` turns its failure on a row into one line naming the row."""

    name: str
    where: str
    fn: Any = field(compare=False, repr=False)

    def __call__(self, *args):
        return self.fn(*args)

    def call(self, row, ref, key: str):
        try:
            return self.fn(row)
        except Exception as exc:  # the task author's code: any failure is that row's, named
            raise ref.fail(key, f"!function {self.name} failed: {type(exc).__name__}: {exc}") from None


class _TaskLoader(BoundedSafeLoader):
    """yaml.SafeLoader (within promptopt's limits on size, nesting and aliases) plus lm-eval's `!function` tag (read
    as a FunctionRef, never run)."""

    folder: Path = Path(".")
    where: str = ""


def _function(loader: _TaskLoader, node: yaml.Node) -> FunctionRef:
    return FunctionRef(str(loader.construct_scalar(node)).strip(), loader.folder, loader.where)


_TaskLoader.add_constructor("!function", _function)


def read_task_yaml(path: str | Path) -> dict:
    """A task file as a mapping, `!function` tags as FunctionRefs; any problem is one ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    loader_class = type("TaskLoader", (_TaskLoader,), {"folder": path.resolve().parent, "where": str(path)})
    try:
        data = yaml.load(read_yaml_text(path), Loader=loader_class)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise yaml_problem(path, exc, functions=True) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def first_function(data: dict, prefix: str = "") -> tuple[str, FunctionRef] | None:
    """The first `!function` in a task mapping, with its dotted key."""
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, FunctionRef):
            return name, value
        if isinstance(value, dict):
            found = first_function(value, f"{name}.")
            if found:
                return found
        if isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, FunctionRef):
                    return f"{name}[{i}]", entry
                if isinstance(entry, dict) and (found := first_function(entry, f"{name}[{i}].")):
                    return found
    return None


def refuse_untrusted_code(data: dict, where: str, trust: bool) -> None:
    """Without trust, a task file holding any `!function` is refused first, naming the flag (before anything else
    about the file is checked: whether to run its code is the first question)."""
    found = None if trust else first_function(data)
    if found:
        raise refuse_untrusted(where, *found)


def contains_function(value: Any) -> bool:
    if isinstance(value, FunctionRef):
        return True
    if isinstance(value, dict):
        return any(contains_function(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_function(v) for v in value)
    return False


def refuse_untrusted(where: str, key: str, ref: FunctionRef) -> ConfigError:
    return ConfigError(
        f"{where}: {key}: !function {ref.name} runs the task file's own Python: pass {TRUST_FLAG} to allow it "
        "(task code never runs by default)"
    )


def resolve(ref: FunctionRef, key: str, *, trust: bool) -> TaskFunction:
    """Import `ref`'s module from the task file's folder (only) and return its function; without `trust`, the
    error line that names the flag."""
    if not trust:
        raise refuse_untrusted(ref.where, key, ref)
    module_name, _, function_name = ref.name.rpartition(".")
    if not module_name or not function_name:
        raise ConfigError(f"{ref.where}: {key}: !function {ref.name!r}: expected module.function")
    folder = ref.folder.resolve()
    path = (folder / f"{module_name.replace('.', '/')}.py").resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise ConfigError(
            f"{ref.where}: {key}: !function {ref.name}: no module {path.name} in the task file's folder {folder} "
            "(task code is read from there only)"
        )
    module = _import(path, ref, key)
    fn = getattr(module, function_name, None)
    if not callable(fn):
        raise ConfigError(f"{ref.where}: {key}: !function {ref.name}: {path.name} has no function {function_name}")
    return TaskFunction(ref.name, ref.where, fn)


_MODULES: dict[tuple[str, int], Any] = {}  # (file, mtime) -> module: a file is imported once per version


def _import(path: Path, ref: FunctionRef, key: str):
    stamp = (str(path), path.stat().st_mtime_ns)
    if stamp in _MODULES:
        return _MODULES[stamp]
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"promptopt_task_code_{digest}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the task author's module: its import failing is one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"{ref.where}: {key}: !function {ref.name}: importing {path.name} failed: {type(exc).__name__}: {first}"
        ) from None
    _MODULES[stamp] = module
    return module
