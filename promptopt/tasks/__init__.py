"""Tasks: YAML spec (spec), row fields in lm-eval's convention (fields), answer types (answers), data
sources and carving (data), answer extraction (extract), the code sandbox (sandbox)."""

from promptopt.tasks.answers import ANSWER_TYPES, AnswerType, get_answer_type, register
from promptopt.tasks.data import DataConfig, TaskData, load_task_data
from promptopt.tasks.item import Item
from promptopt.tasks.spec import TaskSpec, builtin_task_names, load_task_spec


def load_task(name_or_path: str, *, subsets: list[str] | None = None) -> TaskData:
    """A task by built-in name or YAML path, with its pool/dev/test carved."""
    return load_task_data(load_task_spec(name_or_path), subsets=subsets)


__all__ = ["ANSWER_TYPES", "AnswerType", "DataConfig", "Item", "TaskData", "TaskSpec", "builtin_task_names", "get_answer_type",
           "load_task", "load_task_data", "load_task_spec", "register"]
