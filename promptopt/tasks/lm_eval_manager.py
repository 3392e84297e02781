"""`--task lmeval:NAME`: a task of lm-eval's own index, built by lm-eval's TaskManager (the `lmeval` extra).

lm-eval loads the data (its `datasets` call, its `process_docs`) and its ConfigurableTask reads every doc
(`doc_to_text`, `doc_to_choice`, `doc_to_target`: lm-eval's own methods, so whatever its task files can say is read
exactly as lm-eval reads it); promptopt scores the items. `lmeval:NAME@FOLDER` adds FOLDER to lm-eval's include path
(its task files take precedence over the index's); lm-eval imports their Python when it builds the task, so that
form needs `trust_task_code`. What promptopt cannot score as lm-eval does is refused in one line, as for a task
file read without lm-eval (lm_eval_task.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from promptopt.errors import ConfigError
from promptopt.tasks.fields import RowRef
from promptopt.tasks.task_code import TRUST_FLAG, TaskFunction

EXTRA = "pip install 'promptopt[lmeval]'"


def lm_eval_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("lm_eval") is not None


def _build(name: str, folder: str | None, where: str):
    """lm-eval's ConfigurableTask for `name` (one task, not a group), lm-eval's own logging kept quiet."""
    from lm_eval.tasks import TaskManager

    loggers = [logging.getLogger(n) for n in ("lm-eval", "lm_eval", "datasets")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        manager = TaskManager(include_path=folder) if folder else TaskManager()
        if name not in manager.all_tasks:
            raise ConfigError(
                f"{where}: lm-eval has no task '{name}'{' in ' + folder + ' or' if folder else ''} in its index"
            )
        built = manager.load([name])
    except ConfigError:
        raise
    except Exception as exc:  # lm-eval's loader, the dataset download, the task's own code: one line
        first = (str(exc).strip().splitlines() or [""])[0]
        hint = " (offline: a hub dataset needs a network)" if "offline" in f"{type(exc).__name__} {exc}".lower() else ""
        raise ConfigError(f"{where}: lm-eval could not build the task: {type(exc).__name__}: {first}{hint}") from None
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    tasks = list(built["tasks"].values())
    if built["groups"] or len(tasks) != 1:
        raise ConfigError(f"{where}: '{name}' is a group of {len(tasks)} tasks in lm-eval; name one of its tasks")
    return tasks[0]


def load_lm_eval_manager_task(text: str, *, trust_task_code: bool = False):
    """`NAME` or `NAME@FOLDER` -> TaskSpec whose rows and fields are lm-eval's."""
    from promptopt.tasks.lm_eval_parts import answer_settings, prompt_settings
    from promptopt.tasks.lm_eval_task import REFUSED, LmEvalField, lm_eval_spec
    from promptopt.tasks.spec import SourceSpec, SplitSpec

    where = f"lmeval:{text}"
    name, _, folder = text.partition("@")
    if not name:
        raise ConfigError(f"{where}: expected lmeval:NAME or lmeval:NAME@FOLDER")
    if not lm_eval_installed():
        raise ConfigError(f"--task {where}: lm-eval is not installed: {EXTRA}")
    if folder:
        if not Path(folder).is_dir():
            raise ConfigError(f"{where}: {folder} is not a folder")
        if not trust_task_code:
            raise ConfigError(
                f"{where}: lm-eval imports the Python of {folder}'s task files when it builds the task: pass "
                f"{TRUST_FLAG} to allow it (task code never runs by default)"
            )
    task = _build(name, folder or None, where)
    config = task.config.to_dict(keep_callable=True)
    for key, what in REFUSED.items():
        if config.get(key) not in (None, False, "", []):
            raise ConfigError(f"{where}: {key}: {what} is not supported")
    output_type = config.get("output_type")
    if output_type not in ("multiple_choice", "generate_until"):
        raise ConfigError(f"{where}: output_type: {output_type} is not supported (multiple_choice and generate_until)")
    settings = {k: v for k, v in config.items() if k in ("metric_list", "generation_kwargs", "filter_list")}
    settings["metric_list"] = [
        {k: v for k, v in m.items() if k in ("metric", "aggregation", "higher_is_better") or not callable(v)}
        for m in config.get("metric_list") or []
    ] or None
    answer = answer_settings(
        {**settings, "fewshot_delimiter": config.get("fewshot_delimiter", "\n\n")}, where, output_type
    )
    template, instruction = prompt_settings(
        {
            k: config.get(k)
            for k in ("target_delimiter", "fewshot_delimiter", "description")
            if config.get(k) is not None
        },
        where,
    )
    k = int(config.get("num_fewshot") or 0)
    if k and getattr(task.config.fewshot_config, "sampler", "default") != "first_n":
        raise ConfigError(
            f"{where}: fewshot_config.sampler: lm-eval's default sampler draws other shots for every doc; promptopt "
            "shows every item the same shots (set fewshot_config: {sampler: first_n} in the task file)"
        )
    evaluated = config.get("test_split") or config.get("validation_split") or "eval"
    shots = None
    if k:
        shots = (
            getattr(task.config.fewshot_config, "split", None)
            or config.get("fewshot_split")
            or config.get("training_split")
            or config.get("validation_split")
            or config.get("test_split")
        )
        if shots == evaluated:
            raise ConfigError(
                f"{where}: fewshot_split: shots would come from '{shots}', the evaluated split (lm-eval then leaves out "
                "each evaluated doc): give another fewshot_split"
            )
    docs = {evaluated: task.eval_docs, shots: task.fewshot_docs() if k else None}

    def rows(split: str):
        return [
            (RowRef(f"{split}-{i}", f"{where} {split} doc {i + 1}", where), dict(doc))
            for i, doc in enumerate(docs[split])
        ]

    has_choices = config.get("doc_to_choice") is not None
    fields = {}
    for method, field_name, role in (
        ("doc_to_text", "question", "text"),
        ("doc_to_choice", "choices", "choice"),
        ("doc_to_target", "answer", "target"),
    ):
        if field_name == "choices" and not has_choices:
            continue
        function = TaskFunction(f"lm-eval {name}.{method}", where, getattr(task, method))
        fields[field_name] = LmEvalField.build(function, method, where, role, has_choices)
    splits = {"test": SplitSpec(evaluated, None)}
    if k:
        splits["pool"] = SplitSpec(shots, None)
    return lm_eval_spec(
        name=name,
        where=where,
        description=f"lm-eval task {name}, built by lm-eval's TaskManager",
        source=SourceSpec(loader=rows),
        fields=fields,
        splits=splits,
        answer=answer,
        instruction=instruction,
        k=k,
        template=template,
    )
