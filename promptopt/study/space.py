"""Search spaces: YAML -> typed SearchSpace, and an Optuna trial -> Prompt.

```yaml
task: sst2
instructions:                     # name -> text; the names are the categorical choices
  none: ""
  zero_shot_cot: "Let's think step by step."
exemplars:
  candidates: 16                  # the first N pool items are the exemplar candidates
  k: [0, 4]                       # shots, inclusive range
  search_order: true              # search the order of the chosen shots too
templates:                        # name -> prompt template (see promptopt.prompts.PromptTemplate)
  review: {query: "Review: {question}\nSentiment:"}
  good_bad: {query: "Review: {question}\nThe movie was", label_words: [bad, good]}
formats:                          # optional: equivalent layouts of the chosen template (prompt_formats.py)
  field_separator: true           # true: every choice; or a list, e.g. [": ", " - "]
  casing: [as_is, lower]
proposals:                        # written by `promptopt propose`: where each proposed instruction came from
  grounded_3f2a9c1d: {mode: grounded, proposer: smollm2-135m, proposer_sha256: ..., seed: 0, round: 0, parents: []}
```

Encoding (what the sampler sees), chosen so that every sampled point decodes to a valid prompt and each
parameter carries a meaning a TPE-style sampler can learn:
- `instruction`, `template`: categorical over names.
- `k`: integer in the range.
- exemplar set: one float key in [0, 1) per candidate (`key_<id>`); the k candidates with the highest keys
  are the shots. Random keys never produce duplicates or invalid sets (no rejected trials), and a
  candidate that helps drifts towards high keys, which per-parameter density models learn directly.
  With k = 0 no keys are sampled (they would not change the prompt).
- order: a categorical permutation index `order_k<k>` over the k! orders (k ≤ 5), or Lehmer-code
  integers `lehmer_k<k>_<i>` for larger k; without `search_order` the shots keep pool order.
- format: one categorical `format_<dimension>` per dimension of the `formats:` block, applied to the template.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from promptopt.errors import ConfigError, DataError
from promptopt.prompt_formats import PromptFormat, format_choices
from promptopt.prompts import Prompt, PromptTemplate
from promptopt.tasks.data import Item, TaskData
from promptopt.yamlio import Fields, builtin_names, load_named_yaml

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
_MAX_PERMUTATION_TABLE = 5


@dataclass(frozen=True)
class SearchSpace:
    task: str
    where: str
    instructions: dict[str, str]
    templates: dict[str, PromptTemplate]
    candidates: int
    k_min: int
    k_max: int
    search_order: bool
    formats: dict[str, tuple[str, ...]] = field(default_factory=dict)  # dimension -> choices (searched when given)
    proposals: dict[str, dict] = field(default_factory=dict)  # instruction name -> provenance of a proposed one
    decisions: tuple[str, ...] = ()  # decision rules to search over (promptopt/decision.py); () = not searched

    def widest_format(self, template: PromptTemplate) -> PromptTemplate:
        """The template with the longest choice of every searched dimension: what the length check renders."""
        return PromptFormat(**{name: max(choices, key=len) for name, choices in self.formats.items()}).apply(template)

    def check_against(self, data: TaskData, *, pool_draw: int | None = None) -> list[Item]:
        """The candidate exemplars for this task; errors when the pool cannot supply them.

        pool_draw: None takes the first `candidates` pool items; an integer takes a seeded random draw of
        them from the whole pool (several seeds of one comparison search different candidate sets).

        Args:
            data: the task's carved items.
            pool_draw: None, or a seed for a random draw of the candidates.

        Returns:
            The candidate exemplars.

        Raises:
            ConfigError: the space is for another task (its `task:` is not the task's `name:`), or asks for more
                shots or candidates than the pool holds, or label words that do not match the choices.
            DataError: an empty pool, or a pool item that is also a dev/test item.
        """
        if data.spec.name != self.task:
            raise ConfigError(f"{self.where}: task: the space is for '{self.task}', not '{data.spec.name}'")
        if not data.pool:
            raise DataError(f"{self.where}: the exemplar pool of task {self.task} is empty")
        if self.k_max > len(data.pool):
            raise ConfigError(
                f"{self.where}: exemplars.k: k up to {self.k_max} but the pool has only {len(data.pool)} items"
            )
        if self.k_max > self.candidates:
            raise ConfigError(f"{self.where}: exemplars.k: k up to {self.k_max} but only {self.candidates} candidates")
        if self.candidates > len(data.pool):
            raise ConfigError(
                f"{self.where}: exemplars.candidates: {self.candidates} requested but the pool has only {len(data.pool)} items"
            )
        if pool_draw is None:
            pool = data.pool[: self.candidates]
        else:
            import numpy as np

            order = np.random.default_rng([pool_draw, len(data.pool)]).permutation(len(data.pool))
            pool = [data.pool[i] for i in sorted(order[: self.candidates])]
        evaluated = {i.id for i in data.dev + data.test}
        leaked = [i.id for i in pool if i.id in evaluated]
        if leaked:
            raise DataError(f"{self.where}: pool item {leaked[0]} is also a dev/test item")
        for name, template in self.templates.items():
            if template.label_words and data.spec.answer_type == "multiple_choice":
                n_choices = len(data.dev[0].choices)
                if len(template.label_words) != n_choices:
                    raise ConfigError(
                        f"{self.where}: templates.{name}.label_words: {len(template.label_words)} words for {n_choices} choices"
                    )
        return pool

    # --- trial -> prompt ---------------------------------------------------------------------
    def suggest(self, trial, candidates: list[Item], spec, decision: str | None = None) -> Prompt:
        """Ask the trial for every parameter and decode them into a Prompt. `decision`: the run's one rule
        (--decision); without it the space's `decision:` dimension is searched, else the prompt decides by argmax."""
        if decision is None:
            decision = trial.suggest_categorical("decision", list(self.decisions)) if self.decisions else "argmax"
        return replace(self._suggest_prompt(trial, candidates, spec), decision=decision)

    def _suggest_prompt(self, trial, candidates: list[Item], spec) -> Prompt:
        instruction = trial.suggest_categorical("instruction", list(self.instructions))
        template = self.templates[trial.suggest_categorical("template", list(self.templates))]
        if self.formats:
            template = PromptFormat(
                **{
                    name: trial.suggest_categorical(f"format_{name}", list(choices))
                    for name, choices in self.formats.items()
                }
            ).apply(template)
        k = trial.suggest_int("k", self.k_min, self.k_max)
        if k == 0:  # no shots: the keys would mean nothing, and sampling them would make duplicate prompts
            return Prompt(task=spec.name, instruction=self.instructions[instruction], template=template)
        keys = [trial.suggest_float(f"key_{i}", 0.0, 1.0) for i in range(len(candidates))]
        chosen = sorted(sorted(range(len(candidates)), key=lambda i: (-keys[i], i))[:k])  # pool order
        if self.search_order and k > 1:
            chosen = [chosen[i] for i in _suggest_permutation(trial, k)]
        shots = tuple(candidates[i].as_exemplar() for i in chosen)
        return Prompt(task=spec.name, instruction=self.instructions[instruction], exemplars=shots, template=template)


def _suggest_permutation(trial, k: int) -> list[int]:
    if k <= _MAX_PERMUTATION_TABLE:
        perms = list(itertools.permutations(range(k)))
        return list(perms[trial.suggest_int(f"order_k{k}", 0, math.factorial(k) - 1)])
    remaining = list(range(k))
    order = []
    for i in range(k - 1):
        order.append(remaining.pop(trial.suggest_int(f"lehmer_k{k}_{i}", 0, len(remaining) - 1)))
    return order + remaining


def parse_space(data: dict, where: str) -> SearchSpace:
    """A search space from its YAML mapping (every key: docs/search.md#a-space-file).

    Args:
        data: the space file's mapping.
        where: how errors name it (the file).

    Returns:
        The space; `check_against(task_data)` then checks it against a task (its `task:` must be the task's `name:`).

    Raises:
        ConfigError: an unknown key or an invalid value, naming the file and the key.
    """
    f = Fields(data, where)
    f.reject_unknown(
        {"task", "description", "instructions", "exemplars", "templates", "formats", "proposals", "decision"}
    )
    instructions = f.get("instructions", dict)
    if not instructions or not all(isinstance(v, str) for v in instructions.values()):
        raise f.fail("instructions", "a non-empty mapping of name -> text", instructions)
    templates_raw = f.get("templates", dict)
    if not templates_raw:
        raise f.fail("templates", "a non-empty mapping of name -> template")
    templates = {}
    for name, raw in templates_raw.items():
        template = PromptTemplate.from_dict(raw, f"{where}: templates.{name}")
        templates[str(name)] = PromptTemplate(**{**template.__dict__, "name": str(name)})
    e = f.sub("exemplars")
    e.reject_unknown({"candidates", "k", "search_order", "split"})
    if e.get("split", str, "pool") != "pool":
        raise e.fail("split", "pool (exemplars never come from dev or test)", e.data["split"])
    k_range = e.get("k", (list, int))
    if isinstance(k_range, int):
        k_range = [k_range, k_range]
    if (
        len(k_range) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in k_range)
        or not 0 <= k_range[0] <= k_range[1]
    ):
        raise e.fail("k", "[min, max] with 0 <= min <= max", k_range)
    candidates = e.get("candidates", int, max(k_range[1], 8))
    if candidates < max(1, k_range[1]):
        raise e.fail("candidates", f"at least k max ({k_range[1]})", candidates)
    return SearchSpace(
        task=f.get("task", str),
        where=where,
        instructions={str(k): v for k, v in instructions.items()},
        templates=templates,
        candidates=candidates,
        k_min=k_range[0],
        k_max=k_range[1],
        search_order=e.get("search_order", bool, True),
        formats=format_choices(data.get("formats"), where),
        proposals=_proposals(f, instructions),
        decisions=_decisions(f),
    )


def _decisions(f: Fields) -> tuple[str, ...]:
    """The `decision:` dimension: one rule name or a list of them (promptopt/decision.py)."""
    from promptopt.decision import parse_rule, rule_names

    value = f.get("decision", (str, list), [])
    names = [value] if isinstance(value, str) else value
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise f.fail("decision", "a rule name or a list of distinct rule names", value)
    for name in names:
        try:
            parse_rule(name)
        except ConfigError as exc:
            raise f.fail("decision", rule_names(), name) from exc
    return tuple(names)


def _proposals(f: Fields, instructions: dict) -> dict[str, dict]:
    """The provenance block of proposed instructions: every entry names an instruction of the space."""
    proposals = f.get("proposals", dict, {})
    for name, provenance in proposals.items():
        if str(name) not in {str(k) for k in instructions}:
            raise f.fail(f"proposals.{name}", "the name of an instruction of this space", name)
        if not isinstance(provenance, dict) or "mode" not in provenance:
            raise f.fail(f"proposals.{name}", "a mapping with at least mode:", provenance)
    return {str(k): dict(v) for k, v in proposals.items()}


def builtin_space_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


def load_space(name_or_path: str) -> SearchSpace:
    """A built-in space (by task name) or a space YAML by path (--space).

    Args:
        name_or_path: a built-in task's name, or a space YAML's path.

    Returns:
        The parsed space (see `parse_space`).

    Raises:
        ConfigError: no such space, or an invalid one (naming the file and the key).
    """
    return parse_space(*load_named_yaml(name_or_path, BUILTIN_DIR, "search space"))
