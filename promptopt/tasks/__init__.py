"""Tasks: YAML spec (spec), row fields in lm-eval's convention (fields), answer types (answers), data
sources and carving (data), answer extraction (extract), the code sandbox (sandbox).

The names below are resolved on first use (module `__getattr__`), so importing one light submodule —
`promptopt.tasks.extract`, which production code uses through `promptopt.load_prompt` — does not pull in
numpy, the data loaders or the answer-type registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from promptopt.tasks.data import TaskData

_LAZY = {
    "ANSWER_TYPES": "answers",
    "AnswerType": "answers",
    "get_answer_type": "answers",
    "register": "answers",
    "DataConfig": "data",
    "TaskData": "data",
    "load_task_data": "data",
    "Item": "item",
    "TaskSpec": "spec",
    "builtin_task_names": "catalog",
    "load_task_spec": "catalog",
}


def load_task(name_or_path: str, *, subsets: list[str] | None = None) -> TaskData:
    """A task by built-in name or YAML path, with its pool/dev/test carved.

    Args:
        name_or_path: a built-in task's name (`promptopt tasks` lists them) or a task YAML's path.
        subsets: the subsets to read (e.g. MMLU subjects); None: the task's own.

    Returns:
        The task's spec and its `pool`, `dev` and `test` items.

    Raises:
        ConfigError: an unknown task, or a task file with an invalid field (naming the file and the field).
        DataError: data that cannot be read or carved (naming the task file, then the data file's line and field).
    """
    from promptopt.tasks.catalog import load_task_spec
    from promptopt.tasks.data import load_task_data

    return load_task_data(load_task_spec(name_or_path), subsets=subsets)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"promptopt.tasks.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'promptopt.tasks' has no attribute {name!r}")


__all__ = [
    "ANSWER_TYPES",
    "AnswerType",
    "DataConfig",
    "Item",
    "TaskData",
    "TaskSpec",
    "builtin_task_names",
    "get_answer_type",
    "load_task",
    "load_task_data",
    "load_task_spec",
    "register",
]
