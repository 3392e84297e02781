"""The parts of an lm-eval task file beyond its fields: data source, splits, metrics and decoding, prompt pieces
(see lm_eval_task.py for what is read and how)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from promptopt.errors import ConfigError
from promptopt.tasks.exact_match import EXACT_MATCH_OPTIONS, FILTERS
from promptopt.tasks.paths import check_hub_source, task_root
from promptopt.tasks.spec import MAX_NEW_TOKENS, MAX_SHOTS
from promptopt.yamlio import shown

_MC_METRICS = ("acc", "acc_norm")
_METRIC_KEYS = {"metric", "aggregation", "higher_is_better"}


def _fail(where: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: {message}")


# --- data ---------------------------------------------------------------------------------------------------------
def data_source(data: dict, where: str, trusted: bool = False):
    """dataset_path + dataset_name + dataset_kwargs -> SourceSpec: local json/csv/parquet files, or the hub."""
    from promptopt.tasks.spec import SourceSpec

    path = data.get("dataset_path")
    if not isinstance(path, str) or not path:
        raise _fail(where, "dataset_path", "expected a dataset: json, csv or parquet with data_files, or a hub dataset")
    kwargs = data.get("dataset_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise _fail(where, "dataset_kwargs", f"expected a mapping, got {shown(kwargs)}")
    for key, value in kwargs.items():
        if key == "trust_remote_code":
            if value:
                raise _fail(
                    where,
                    "dataset_kwargs.trust_remote_code",
                    "true runs the dataset's own loading script; promptopt never enables it",
                )
        elif key != "data_files":
            raise _fail(where, f"dataset_kwargs.{key}", "not supported (promptopt passes data_files only)")
    files = kwargs.get("data_files")
    name = data.get("dataset_name")
    if path in LOCAL_BUILDERS:
        if files is None:
            raise _fail(where, "dataset_kwargs.data_files", f"required with dataset_path: {path} (the local files)")
        if name is not None and not isinstance(name, str):
            raise _fail(where, "dataset_name", f"expected text, got {shown(name)}")
        # lm-eval passes dataset_name to datasets.load_dataset as the configuration's name, which a local json, csv or
        # parquet builder takes as a label only and reads data_files all the same (MMLU's per-subject files).
        return SourceSpec(
            files=_split_files(files, path, where),
            files_base=files_base(),
            root=None if trusted else str(task_root(where)),
            files_key="dataset_kwargs.data_files",
        )
    if name is not None and not isinstance(name, str):
        raise _fail(where, "dataset_name", f"expected text, got {shown(name)}")
    check_hub_source(path, files, where, "dataset_path", None if trusted else task_root(where))
    return SourceSpec(hub_path=path, hub_name=name, hub_kwargs={"data_files": files} if files is not None else {})


LOCAL_BUILDERS = {"json": (".json", ".jsonl"), "csv": (".csv",), "parquet": (".parquet",)}


def _split_files(files: Any, builder: str, where: str) -> dict[str, str]:
    """data_files as datasets reads it: one file (split 'train'), a list (split 'train') or split -> file(s)."""
    if isinstance(files, (str, list)):
        files = {"train": files}
    if not isinstance(files, dict) or not files:
        raise _fail(where, "dataset_kwargs.data_files", f"expected a file, a list or split: file, got {shown(files)}")
    out = {}
    for split, value in files.items():
        key = f"dataset_kwargs.data_files.{split}"
        if isinstance(value, list):
            if len(value) != 1:
                raise _fail(where, key, f"{len(value)} files: promptopt reads one file per split")
            value = value[0]
        if not isinstance(value, str):
            raise _fail(where, key, f"expected a file name, got {shown(value)}")
        suffixes = [s for s in Path(value).suffixes if s != ".gz"]
        if not suffixes or suffixes[-1] not in LOCAL_BUILDERS[builder]:
            raise _fail(where, key, f"{value}: not a {builder} file ({', '.join(LOCAL_BUILDERS[builder])})")
        out[str(split)] = value
    return out


# --- splits -------------------------------------------------------------------------------------------------------
def split_roles(data: dict, where: str) -> tuple[int, dict]:
    """(num_fewshot, role -> SplitSpec) in lm-eval's order (module docstring of lm_eval_task.py)."""
    from promptopt.tasks.spec import SplitSpec

    names = {}
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise _fail(where, key, f"expected a split name, got {shown(value)}")
        names[key] = value
    evaluated = names["test_split"] or names["validation_split"]
    if evaluated is None:
        raise _fail(where, "test_split", "test_split or validation_split is required (the split lm-eval evaluates on)")
    k = data.get("num_fewshot") or 0
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_SHOTS:
        raise _fail(where, "num_fewshot", f"expected an integer from 0 to {MAX_SHOTS}, got {shown(k)}")
    config = data.get("fewshot_config") or {}
    if not isinstance(config, dict):
        raise _fail(where, "fewshot_config", f"expected a mapping, got {shown(config)}")
    for key, value in config.items():
        if key == "sampler":
            if value not in ("first_n", "default"):
                raise _fail(where, "fewshot_config.sampler", f"{shown(value)} is not supported (first_n)")
        elif key == "split":
            names["fewshot_split"] = value
        elif key in ("fewshot_delimiter", "target_delimiter"):
            if value != data.get(key, " " if key == "target_delimiter" else "\n\n"):
                raise _fail(where, f"fewshot_config.{key}", "a different delimiter for shots is not supported")
        else:
            raise _fail(where, f"fewshot_config.{key}", "not supported (sampler: first_n and split are read)")
    splits = {"test": SplitSpec(evaluated, None)}
    dev = (
        names["validation_split"] if names["test_split"] and names["validation_split"] != names["test_split"] else None
    )
    if dev:
        splits["dev"] = SplitSpec(dev, None)
    if k:
        if config.get("sampler", "default") != "first_n":
            raise _fail(
                where,
                "fewshot_config.sampler",
                "lm-eval's default sampler draws other shots for every doc; promptopt shows every item the same shots: "
                "set fewshot_config: {sampler: first_n}",
            )
        shots = names["fewshot_split"] or names["training_split"] or names["validation_split"] or names["test_split"]
        if shots == evaluated:
            raise _fail(
                where,
                "fewshot_split",
                f"shots would come from '{shots}', the evaluated split (lm-eval then leaves out each evaluated doc): "
                "give another fewshot_split",
            )
        if shots == dev:
            del splits["dev"]  # the pool takes that split
        splits["pool"] = SplitSpec(shots, None)
    return k, splits


# --- answers ------------------------------------------------------------------------------------------------------
def answer_settings(data: dict, where: str, output_type: str) -> dict:
    """The answer type, its main metric, decoding and judging options for an output type and metric_list."""
    metrics = data.get("metric_list")
    if metrics is None:
        metrics = [{"metric": m} for m in (_MC_METRICS if output_type == "multiple_choice" else ("exact_match",))]
    if not isinstance(metrics, list) or not metrics:
        raise _fail(where, "metric_list", f"expected a list of metrics, got {shown(metrics)}")
    names, options = [], {}
    for i, entry in enumerate(metrics):
        if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
            raise _fail(where, f"metric_list[{i}]", f"expected {{metric: NAME, ...}}, got {shown(entry)}")
        metric = entry["metric"]
        allowed = _MC_METRICS if output_type == "multiple_choice" else ("exact_match",)
        if metric not in allowed:
            raise _fail(
                where, f"metric_list[{i}].metric", f"{metric} is not supported for {output_type} ({', '.join(allowed)})"
            )
        if entry.get("aggregation", "mean") != "mean" or entry.get("higher_is_better", True) is not True:
            raise _fail(where, f"metric_list[{i}]", f"{metric} is read with aggregation: mean, higher_is_better: true")
        extra = set(entry) - _METRIC_KEYS
        if metric == "exact_match":
            unknown = sorted(extra - set(EXACT_MATCH_OPTIONS))
            if unknown:
                raise _fail(where, f"metric_list[{i}].{unknown[0]}", "not an exact_match option promptopt reads")
            options = {k: entry[k] for k in extra}
        elif extra:
            raise _fail(where, f"metric_list[{i}].{sorted(extra)[0]}", f"not supported for {metric}")
        names.append(metric)
    if output_type == "multiple_choice":
        for key in ("generation_kwargs", "filter_list"):
            if data.get(key) is not None:
                raise _fail(where, key, "read for generate_until tasks only")
        return {"type": "multiple_choice", "metric": names[0], "max_new_tokens": 32, "stop": (), "judge_options": {}}
    max_new, stop = _generation(data, where)
    return {
        "type": "exact_match",
        "metric": "acc",
        "max_new_tokens": max_new,
        "stop": stop,
        "judge_options": {"exact_match": options, "filters": _filters(data, where)},
    }


def _generation(data: dict, where: str) -> tuple[int, tuple[str, ...]]:
    fewshot = data.get("fewshot_delimiter", "\n\n")
    kwargs = data.get("generation_kwargs")
    if kwargs is None:
        return 256, (fewshot,)  # lm-eval's default_gen_kwargs: until the few-shot delimiter, 256 tokens, greedy
    if not isinstance(kwargs, dict):
        raise _fail(where, "generation_kwargs", f"expected a mapping, got {shown(kwargs)}")
    for key, value in kwargs.items():
        if key == "do_sample" and value:
            raise _fail(where, "generation_kwargs.do_sample", "true is not supported (greedy decoding)")
        if key == "temperature" and (not isinstance(value, (int, float)) or isinstance(value, bool) or value != 0):
            raise _fail(where, "generation_kwargs.temperature", f"{shown(value)} is not supported (greedy decoding: 0)")
        if key not in ("until", "max_gen_toks", "do_sample", "temperature"):
            raise _fail(where, f"generation_kwargs.{key}", "not supported (until, max_gen_toks, greedy decoding)")
    until = kwargs.get("until", [fewshot])
    until = [until] if isinstance(until, str) else until
    if not isinstance(until, list) or not all(isinstance(u, str) and u for u in until):
        raise _fail(where, "generation_kwargs.until", f"expected a list of non-empty strings, got {shown(until)}")
    max_new = kwargs.get("max_gen_toks", 256)
    if not isinstance(max_new, int) or isinstance(max_new, bool) or not 1 <= max_new <= MAX_NEW_TOKENS:
        raise _fail(
            where,
            "generation_kwargs.max_gen_toks",
            f"expected an integer from 1 to {MAX_NEW_TOKENS}, got {shown(max_new)}",
        )
    return max_new, tuple(until)


def _filters(data: dict, where: str) -> tuple:
    pipelines = data.get("filter_list")
    if pipelines is None:
        return ()
    if not isinstance(pipelines, list) or len(pipelines) != 1:
        raise _fail(where, "filter_list", "promptopt reads one filter pipeline (it scores one answer per item)")
    pipeline = pipelines[0]
    if not isinstance(pipeline, dict) or not isinstance(pipeline.get("filter"), list):
        raise _fail(where, "filter_list[0]", f"expected {{name: ..., filter: [...]}}, got {shown(pipeline)}")
    steps = []
    for i, step in enumerate(pipeline["filter"]):
        key = f"filter_list[0].filter[{i}]"
        if not isinstance(step, dict) or step.get("function") not in FILTERS:
            function = step.get("function") if isinstance(step, dict) else step
            raise _fail(where, key, f"filter {shown(function)} is not supported ({', '.join(FILTERS)})")
        options = {k: v for k, v in step.items() if k != "function"}
        allowed = {"regex": {"regex_pattern", "group_select", "fallback"}}.get(step["function"], set())
        if set(options) - allowed:
            raise _fail(where, f"{key}.{sorted(set(options) - allowed)[0]}", f"not an option of {step['function']}")
        _check_filter_options(options, key, where)
        steps.append((step["function"], options))
    return tuple(steps)


def _check_filter_options(options: dict, key: str, where: str) -> None:
    """The regex filter's options, checked when the file is read (not at the first answer, after the model loaded)."""
    import re

    select = options.get("group_select", 0)
    if not isinstance(select, int) or isinstance(select, bool) or not -1000 <= select <= 1000:
        raise _fail(where, f"{key}.group_select", f"expected an integer from -1000 to 1000, got {shown(select)}")
    for name in ("regex_pattern", "fallback"):
        if name in options and not isinstance(options[name], str):
            raise _fail(where, f"{key}.{name}", f"expected text, got {shown(options[name])}")
    if "regex_pattern" in options:
        try:
            re.compile(options["regex_pattern"])
        except re.error as exc:
            raise _fail(where, f"{key}.regex_pattern", f"invalid regular expression: {exc}") from None


# --- prompt -------------------------------------------------------------------------------------------------------
def prompt_settings(data: dict, where: str):
    """(template, instruction): lm-eval's delimiters, and its description as the instruction."""
    template = template_for(data, where)
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise _fail(where, "description", f"expected text, got {shown(description)}")
    if "{{" in description or "{%" in description:
        raise _fail(where, "description", "a template over the doc is not supported (one instruction for every item)")
    if description and not description.endswith(template.separator):
        raise _fail(
            where,
            "description",
            f"lm-eval puts nothing between the description and the first shot; promptopt puts fewshot_delimiter "
            f"({template.separator!r}) after its instruction: end the description with it",
        )
    return template, description[: len(description) - len(template.separator)] if description else ""


def template_for(data: dict, where: str):
    """lm-eval's delimiters as a template: the query alone, shots joined by fewshot_delimiter."""
    from promptopt.prompts import PromptTemplate

    target, fewshot = data.get("target_delimiter", " "), data.get("fewshot_delimiter", "\n\n")
    for key, value in (("target_delimiter", target), ("fewshot_delimiter", fewshot)):
        if not isinstance(value, str):
            raise _fail(where, key, f"expected text, got {shown(value)}")
    return PromptTemplate(query="{question}", separator=fewshot, answer_delimiter=target, name="lm-eval")


def files_base() -> str:
    """Where relative data_files are read from: the working directory, as datasets.load_dataset reads them."""
    return os.getcwd()
