"""Where a task comes from: a built-in name, a task YAML of promptopt's schema, an lm-eval task file as it is
written, or `lmeval:NAME` (lm-eval's own index). The one entry point that reads any of them (`load_task_spec`), above
the parsers it dispatches to (spec.py, lm_eval_task.py, lm_eval_manager.py)."""

from __future__ import annotations

from pathlib import Path

from promptopt.tasks.spec import TaskSpec, parse_task
from promptopt.tasks.task_code import read_task_yaml
from promptopt.yamlio import builtin_names

BUILTIN_DIR = Path(__file__).parent / "builtin"


def builtin_task_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


LMEVAL_PREFIX = "lmeval:"


def load_task_spec(name_or_path: str, *, trust_task_code: bool = False) -> TaskSpec:
    """A built-in task by name, a task YAML by path (promptopt's schema, or lm-eval's as it is), or `lmeval:NAME`
    (a task of lm-eval's own index, through lm-eval's TaskManager; `lmeval:NAME@FOLDER` adds FOLDER's task files).
    `trust_task_code` lets the task file's `!function` hooks run (tasks/task_code.py).

    Args:
        name_or_path: a built-in name, a task YAML path, or "lmeval:NAME[@FOLDER]".
        trust_task_code: run the task file's own Python (off by default: docs/guarantees.md#task-code).

    Returns:
        The parsed, validated task (no data read yet).

    Raises:
        ConfigError: an unknown task, or an invalid field (naming the file and the field).
    """
    from promptopt.errors import ConfigError

    if name_or_path.startswith(LMEVAL_PREFIX):
        from promptopt.tasks.lm_eval_manager import load_lm_eval_manager_task

        return load_lm_eval_manager_task(name_or_path[len(LMEVAL_PREFIX) :], trust_task_code=trust_task_code)
    path = Path(name_or_path)
    if not (name_or_path.endswith((".yaml", ".yml")) or path.is_file()):
        path = BUILTIN_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"unknown task '{name_or_path}': built-in tasks are {', '.join(builtin_task_names())}, "
                "or give the path of a task YAML, or lmeval:NAME for a task of lm-eval's index"
            )
    data, where = read_task_yaml(path), str(path)
    from promptopt.tasks.lm_eval_task import is_lm_eval_task, parse_lm_eval_task

    if is_lm_eval_task(data, where):
        return parse_lm_eval_task(data, where, trust_task_code=trust_task_code)
    return parse_task(data, where, trust_task_code=trust_task_code)
