"""Stress protocols: a named, documented way to run taboo stress (prompt, decoding budget, items, answer
extraction), so that "the paper's setting" is one flag instead of a recipe to re-type.

A protocol file (`perturbations/protocols/<name>.yaml`, or any path) fixes, for every task it covers,
the prompt (instruction, template, exemplars — chain of thought in `taboo-paper`), and for all of them
the decoding budget, stop strings, answer extraction (`answer.extract`, see tasks/answers.py), the
seeded subsample and the default ranks. `apply` turns a task's data into the protocol's (task data with
those generation settings, prompt, items); everything else (taboo mask, metrics) is unchanged.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from pathlib import Path

from promptopt.errors import UserError
from promptopt.prompts import Prompt, PromptTemplate, prompt_from_card
from promptopt.tasks import Item
from promptopt.tasks.answers import EXTRACTIONS
from promptopt.tasks.catalog import load_task_spec
from promptopt.tasks.data import DataConfig, TaskData, load_task_data
from promptopt.yamlio import Fields, builtin_names, load_named_yaml

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "perturbations" / "protocols"


@dataclass(frozen=True)
class StressProtocol:
    name: str
    where: str
    n: int | None  # items per task (None: the whole split); capped at the split's size
    seed: int
    split: str
    ranks: tuple[int, ...]
    max_new_tokens: int
    stop: tuple[str, ...]
    extract: str
    prompts: dict[str, Prompt]  # task name -> the protocol's prompt for it
    digest: str  # sha256 of the file: a resumed sweep must run the same protocol

    def apply(self, data: DataConfig, *, limit: int | None = None) -> tuple[TaskData, Prompt, list[Item]]:
        """The task's data with the protocol's decoding and extraction, its prompt, and its items: a fixed
        seeded subsample of the split, in the split's order (`limit` keeps the first of those). The protocol
        brings its own shots, so for `split: test` the test split takes every item the task's pool and dev
        leave (GSM8K: 1,179 instead of the 300 a search evaluates on), which the sample is drawn from."""
        spec = load_task_spec(data.task, trust_task_code=data.trust_task_code)
        task = spec.name
        if task not in self.prompts:
            hint = " (use mmlu_gen: the letter is generated)" if task == "mmlu" else ""
            raise UserError(
                f"{self.where}: protocol {self.name} has no prompt for task {task}{hint}; it covers "
                f"{', '.join(sorted(self.prompts))} (copy the file and add the task under tasks:)"
            )
        if not spec.generative or spec.answer_type == "code":
            what = "is scored by log-likelihood" if not spec.generative else "is run, not read from an answer line"
            raise UserError(
                f"{self.where}: tasks.{task}: protocol {self.name} reads chain-of-thought answers; {task} {what}"
            )
        splits = dict(spec.splits)
        if self.split == "test":
            splits["test"] = replace(splits["test"], size=None)
        spec = replace(spec, max_new_tokens=self.max_new_tokens, stop=self.stop, extract=self.extract, splits=splits)
        carved = load_task_data(spec, subsets=list(data.subsets) if data.subsets else None)
        return carved, self.prompts[task], self.items(carved, limit=limit)

    def items(self, data: TaskData, *, limit: int | None = None) -> list[Item]:
        pool = data.split(self.split)
        n = len(pool) if self.n is None else min(self.n, len(pool))
        keep = sorted(random.Random(self.seed).sample(range(len(pool)), n))
        return [pool[i] for i in keep][:limit]


def builtin_protocol_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


def load_protocol(name_or_path: str) -> StressProtocol:
    """A built-in protocol by name (`taboo-paper`) or a protocol YAML by path."""
    return parse_protocol(*load_named_yaml(name_or_path, BUILTIN_DIR, "protocol"))


def parse_protocol(data: dict, where: str) -> StressProtocol:
    f = Fields(data, where)
    f.reject_unknown(
        {"name", "description", "n", "seed", "split", "ranks", "max_new_tokens", "stop", "extract", "tasks"}
    )
    n = f.get("n", int, None)
    if n is not None and n < 1:
        raise f.fail("n", "a positive integer or null (the whole split)", n)
    ranks = f.get("ranks", list, [1, 2, 4, 8])
    if not ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in ranks):
        raise f.fail("ranks", "a list of positive integers", ranks)
    max_new = f.get("max_new_tokens", int)
    if max_new < 1:
        raise f.fail("max_new_tokens", "a positive integer", max_new)
    stop = f.get("stop", list, [])
    if not all(isinstance(s, str) and s for s in stop):
        raise f.fail("stop", "a list of non-empty strings", stop)
    tasks = f.sub("tasks")
    if not tasks.data:
        raise f.fail("tasks", "at least one task")
    prompts = {}
    for task, raw in tasks.data.items():
        t = Fields(raw, where, f"tasks.{task}")
        t.reject_unknown({"instruction", "template", "exemplars"})
        PromptTemplate.from_dict(t.get("template", dict, {}), f"{where}: tasks.{task}")  # names the task on error
        prompts[str(task)] = prompt_from_card({"task": str(task), **raw}, f"{where}: tasks.{task}")
    return StressProtocol(
        name=f.get("name", str, Path(where).stem),
        where=where,
        n=n,
        seed=f.get("seed", int, 0),
        split=f.choice("split", ("test", "dev", "pool"), "test"),
        ranks=tuple(ranks),
        max_new_tokens=max_new,
        stop=tuple(stop),
        extract=f.choice("extract", EXTRACTIONS, "answer_line"),
        prompts=prompts,
        digest=hashlib.sha256(Path(where).read_bytes()).hexdigest(),
    )
