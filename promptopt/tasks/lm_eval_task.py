"""An lm-evaluation-harness task YAML, read as it is and as lm-eval reads it, without lm-eval installed.

A task file with lm-eval's keys (`task:`, `dataset_path:`, `output_type:`, ...) becomes a TaskSpec:

- data: `dataset_path: json | csv | parquet` with `dataset_kwargs: {data_files: ...}` reads local files (relative
  paths from the working directory, as `datasets.load_dataset` resolves them); any other `dataset_path` is a hub
  dataset, loaded through `datasets.load_dataset(dataset_path, dataset_name)` (offline: one line saying so);
- splits, in lm-eval's order (no shuffle): the evaluated split (`test_split`, else `validation_split`) is test; with
  `num_fewshot` > 0 the few-shot split (`fewshot_split`, else `training_split`, else `validation_split`) is the pool,
  whose first `num_fewshot` docs are the shots (lm-eval's `first_n` sampler); `validation_split` beside a
  `test_split` is dev;
- `process_docs` and `!function` fields run the task's own Python, with `trust_task_code` only (task_code.py);
- `doc_to_text` / `doc_to_choice` / `doc_to_target`: a column name, else a Jinja template (in the sandbox), read as
  lm-eval reads them (rendered digits are an index when the task has choices, `doc_to_choice` renders a Python
  list, a list or mapping is literal); `doc_to_text` giving an index makes the choices contexts (multiple inputs);
- `target_delimiter`, `fewshot_delimiter`, `description` (plain text ending in the few-shot delimiter);
- `output_type: multiple_choice` with `metric_list` of `acc` / `acc_norm`; `generate_until` with `exact_match` (and
  its options), `generation_kwargs` (`until`, `max_gen_toks`, greedy) and a `filter_list` of one pipeline
  (exact_match.py).

Every other key, and every value these readings cannot honour, is refused in one line naming it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from promptopt.errors import ConfigError
from promptopt.tasks.fields import FieldSpec, RowRef
from promptopt.tasks.paths import confined, task_root
from promptopt.tasks.task_code import FunctionRef, TaskFunction, read_task_yaml, refuse_untrusted_code, resolve
from promptopt.yamlio import shown

MARKERS = {
    "task",
    "include",
    "dataset_path",
    "dataset_name",
    "dataset_kwargs",
    "output_type",
    "metric_list",
    "training_split",
    "validation_split",
    "test_split",
    "fewshot_split",
    "num_fewshot",
    "fewshot_config",
    "generation_kwargs",
    "filter_list",
}
PROMPTOPT_KEYS = {"name", "source", "splits", "answer", "prompt", "fields", "columns", "generation"}
READ = MARKERS | {
    "process_docs",
    "doc_to_text",
    "doc_to_choice",
    "doc_to_target",
    "description",
    "target_delimiter",
    "fewshot_delimiter",
    "repeats",
}
METADATA = {"tag", "task_alias", "metadata", "should_decontaminate", "doc_to_decontamination_query"}  # change nothing
REFUSED = {
    "doc_to_image": "multimodal inputs",
    "doc_to_audio": "multimodal inputs",
    "use_prompt": "promptsource prompts",
    "process_results": "a metric computed by the task's own Python",
    "custom_dataset": "a dataset built by the task's own Python",
    "unsafe_code": "tasks that run generated code (use promptopt's code answer type)",
    "gen_prefix": "an answer prefix",
    "class": "a Python task class",
    "group": "a group of tasks (pass one task's file)",
    "task_list": "a list of tasks (pass one task's file)",
}


def is_lm_eval_task(data: dict, where: str) -> bool:
    """Whether a task file is written in lm-eval's schema (`task:`, `dataset_path:`, ...) rather than promptopt's."""
    theirs, ours = sorted(set(data) & MARKERS), sorted(set(data) & PROMPTOPT_KEYS)
    if theirs and ours:
        raise ConfigError(
            f"{where}: mixes lm-eval's keys ({theirs[0]}) with promptopt's ({ours[0]}): a task file is written in one of "
            "the two schemas"
        )
    return bool(theirs)


@dataclass(frozen=True)
class LmEvalField(FieldSpec):
    """A doc_to_* field read exactly as lm-eval's ConfigurableTask reads it (see the module docstring)."""

    role: str = "text"  # text | choice | target
    has_choices: bool = False  # the task sets doc_to_choice: rendered digits are then an index

    @classmethod
    def build(cls, raw: Any, key: str, where: str, role: str, has_choices: bool) -> LmEvalField:
        from promptopt.tasks.jinja import jinja_env, template_names

        common = {"role": role, "has_choices": has_choices}
        if isinstance(raw, TaskFunction):
            return cls(key, raw, "function", template=raw, **common)
        if isinstance(raw, int) and not isinstance(raw, bool):
            return cls(key, raw, "literal", **common)
        if isinstance(raw, list) and role != "text":
            return cls(key, list(raw), "literal", **common)
        if isinstance(raw, dict) and role == "choice":
            return cls(key, list(raw.values()), "literal", **common)
        if not isinstance(raw, str):
            raise ConfigError(
                f"{where}: {key}: expected a column name, a Jinja template or !function, got {shown(raw)}"
            )
        import jinja2

        try:
            template = jinja_env().from_string(raw)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{where}: {key}: invalid Jinja template (line {exc.lineno}: {exc.message})") from None
        return cls(key, raw, "lm-eval", template=template, names=template_names(raw), **common)

    def resolve(self, row: dict, ref: RowRef) -> Any:
        if self.kind != "lm-eval":
            return super().resolve(row, ref)
        if isinstance(row, dict) and self.raw in row:  # lm-eval: a name among the dataset's columns is that column
            return row[self.raw]
        text = self.render(row, ref)
        if self.role == "choice":
            import ast

            try:
                return ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ref.fail(
                    self.key, f"template must render a list such as ['a', 'b'], got {shown(text[:60])}", "not a list"
                ) from None
        if self.has_choices and text.isdigit():
            return int(text)
        if self.role == "target" and len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            import ast

            try:
                return ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return text
        return text

    def target(self, row: dict, ref: RowRef) -> Any:
        return self.resolve(row, ref)

    def missing_column(self, row: dict) -> str | None:
        """The column this field names when the row has no such column (a bare name such as `label`, which lm-eval
        then renders as the text 'label'), for a message that says so; None when it is a column or a template."""
        from promptopt.tasks.fields import _IDENTIFIER

        if self.kind != "lm-eval" or not isinstance(self.raw, str) or not isinstance(row, dict):
            return None
        return self.raw if _IDENTIFIER.match(self.raw) and self.raw not in row else None


def _with_includes(
    data: dict, where: str, root: Path | None, seen: tuple[str, ...] = (), origins: dict | None = None
) -> tuple[dict, dict]:
    """lm-eval's `include:` (a file or a list, relative to the including file): included keys, then the file's own;
    with the file each key came from. Every included file must lie in `root` (the task file's folder tree, symlinks
    followed; None: a trusted task, anywhere)."""
    origins = {} if origins is None else origins
    if "include" not in data:
        return data, dict.fromkeys(data, where)
    includes = data["include"] if isinstance(data["include"], list) else [data["include"]]
    merged: dict = {}
    for include in includes:
        if not isinstance(include, str) or not include:
            raise ConfigError(f"{where}: include: expected a file name, got {shown(include)}")
        path = confined(Path(where).parent / include, root, where, "include", include)
        if str(path) in seen:
            raise ConfigError(f"{where}: include: {include} includes itself")
        inner, inner_origins = _with_includes(
            read_task_yaml(path), str(path), root, (*seen, str(Path(where).resolve()))
        )
        inner.pop("task_list", None)
        merged.update(inner)
        origins.update({key: f"{inner_origins.get(key, path)} (included by {where})" for key in inner})
    merged.update({k: v for k, v in data.items() if k != "include"})
    origins.update({k: where for k in data if k != "include"})
    return merged, origins


def _fail(where: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: {message}")


def _check_keys(data: dict, where: str, origins: dict) -> None:
    """Refused keys by name; an unknown key by name only when it looks like a typo of a key promptopt reads (an
    included file may be anything: its other keys are counted, never quoted)."""
    for key in data:
        if key in REFUSED:
            raise _fail(origins.get(key, where), key, f"{REFUSED[key]} is not supported by promptopt's lm-eval reader")
    unknown = [key for key in data if key not in READ | METADATA]
    if not unknown:
        return
    known = sorted(READ | METADATA | set(REFUSED))
    read = ", ".join(sorted(READ - {"include"}))
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.75) if len(str(key)) <= 40 else []
        if close:
            raise _fail(
                origins.get(key, where),
                key,
                f"unknown or unsupported lm-eval task key (did you mean '{close[0]}'? read: {read})",
            )
    files = sorted({origins.get(key, where) for key in unknown})
    raise ConfigError(
        f"{files[0]}: {len(unknown)} key{'s' if len(unknown) > 1 else ''} that no lm-eval task file has (not quoted: an "
        f"unknown key is named only when it looks like a typo of one promptopt reads: {read})"
    )


def _text(data: dict, key: str, where: str, default: Any = None) -> Any:
    value = data.get(key, default)
    if value is not None and not isinstance(value, str):
        raise _fail(where, key, f"expected text, got {shown(value)}")
    return value


def parse_lm_eval_task(data: dict, where: str, *, trust_task_code: bool = False):
    """An lm-eval task file -> TaskSpec (module docstring)."""
    from promptopt.tasks.lm_eval_parts import answer_settings, data_source, prompt_settings, split_roles

    data, origins = _with_includes(data, where, None if trust_task_code else task_root(where))
    refuse_untrusted_code(data, where, trust_task_code)
    _check_keys(data, where, origins)
    name = _text(data, "task", where)
    if not name:
        raise _fail(where, "task", "expected the task's name")
    output_type = _text(data, "output_type", where, "generate_until")
    if output_type not in ("multiple_choice", "generate_until"):
        raise _fail(
            where,
            "output_type",
            f"{output_type} is not supported (promptopt reads lm-eval's multiple_choice and generate_until tasks)",
        )
    repeats = data.get("repeats", 1)
    if repeats != 1:
        raise _fail(where, "repeats", f"{shown(repeats)} is not supported (one answer per item)")
    k, splits = split_roles(data, where)
    answer = answer_settings(data, where, output_type)
    template, instruction = prompt_settings(data, where)
    process = data.get("process_docs")
    if process is not None and not isinstance(process, FunctionRef):
        raise _fail(where, "process_docs", "expected !function module.name (lm-eval's Python hook)")
    return lm_eval_spec(
        name=name,
        where=where,
        description=f"lm-eval task {name} ({where})",
        source=data_source(data, where, trust_task_code),
        fields=fields_of(data, where, output_type, trust_task_code),
        splits=splits,
        answer=answer,
        instruction=instruction,
        k=k,
        template=template,
        process_docs=resolve(process, "process_docs", trust=trust_task_code) if process is not None else None,
    )


def lm_eval_spec(*, name, where, description, source, fields, splits, answer, instruction, k, template, **extra):
    """The TaskSpec of an lm-eval task, read from its file here or built by lm-eval's TaskManager
    (lm_eval_manager.py): what lm-eval fixes (plain golds, source order, repeated choices allowed) is set once."""
    from promptopt.tasks.spec import TaskSpec

    return TaskSpec(
        name=name.replace("/", "_"),
        where=where,
        description=description,
        source=source,
        fields=fields,
        splits=splits,
        seed=1234,
        metric=answer["metric"],
        answer_type=answer["type"],
        gold_format="plain",
        max_new_tokens=answer["max_new_tokens"],
        stop=answer["stop"],
        instruction=instruction,
        k=k,
        template=template,
        allow_duplicate_choices=True,  # lm-eval accepts a repeated choice (a tie between equal ones counts wrong here)
        order="source",
        dialect="lm-eval",
        judge_options=answer["judge_options"],
        **extra,
    )


def fields_of(data: dict, where: str, output_type: str, trust: bool) -> dict[str, FieldSpec]:
    has_choices = data.get("doc_to_choice") is not None
    if output_type == "multiple_choice" and not has_choices:
        raise _fail(where, "doc_to_choice", "required for output_type multiple_choice")
    fields = {}
    for key, name, role in (
        ("doc_to_text", "question", "text"),
        ("doc_to_choice", "choices", "choice"),
        ("doc_to_target", "answer", "target"),
    ):
        raw = data.get(key)
        if raw is None:
            if key != "doc_to_choice":
                raise _fail(where, key, "required (a column name, a Jinja template or !function)")
            continue
        if isinstance(raw, FunctionRef):
            raw = resolve(raw, key, trust=trust)
        fields[name] = LmEvalField.build(raw, key, where, role, has_choices)
    return fields
