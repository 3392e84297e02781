"""Tasks: YAML spec (spec), data sources and carving (data), answer extraction (extract), code sandbox."""

from promptopt.tasks.data import Item, TaskData, load_task_data
from promptopt.tasks.spec import TaskSpec, builtin_task_names, load_task_spec


def load_task(name_or_path: str, *, subsets: list[str] | None = None) -> TaskData:
    """A task by built-in name or YAML path, with its pool/dev/test carved."""
    return load_task_data(load_task_spec(name_or_path), subsets=subsets)


__all__ = ["Item", "TaskData", "TaskSpec", "builtin_task_names", "load_task", "load_task_data", "load_task_spec"]
