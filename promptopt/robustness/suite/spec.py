"""A perturbation suite from YAML (built-in by name, or a file): its families (an operator and its options each),
seed, similarity threshold and distractor sentences; which of its families a search has seen; and the hash of
what it does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from promptopt.errors import ConfigError
from promptopt.robustness.perturb import OPERATORS
from promptopt.yamlio import Fields, builtin_names, load_named_yaml

BUILTIN_DIR = Path(__file__).resolve().parent.parent.parent / "perturbations"


@dataclass(frozen=True)
class Family:
    name: str
    operator: str
    options: dict


@dataclass(frozen=True)
class Suite:
    name: str
    where: str
    seed: int
    similarity_threshold: float
    variants_per_item: int
    families: tuple[Family, ...]
    distractors: tuple[str, ...] = field(default=())


def suite_sha256(suite: Suite) -> str:
    """The hash of what a suite does (its families, options, seed, threshold, distractors), not of where its
    file lies: a study, an evaluation or a proposal made under it is the same wherever promptopt is installed
    (another clone, another worker's machine)."""
    from dataclasses import asdict

    from promptopt.card import sha256_json

    content = asdict(suite)
    content.pop("where")
    return sha256_json(content)


def parse_suite(data: dict, where: str) -> Suite:
    f = Fields(data, where)
    f.reject_unknown(
        {"name", "description", "seed", "similarity_threshold", "variants_per_item", "distractors", "families"}
    )
    threshold = float(f.get("similarity_threshold", (int, float), 0.8))
    if not 0 <= threshold <= 1:
        raise f.fail("similarity_threshold", "a number in [0, 1]", threshold)
    variants = f.get("variants_per_item", int, 1)
    if variants < 1:
        raise f.fail("variants_per_item", "a positive integer", variants)
    families = []
    fam = f.sub("families")
    if not fam.data:
        raise f.fail("families", "at least one family")
    for name, raw in fam.data.items():
        spec = Fields(raw, where, f"families.{name}")
        operator = spec.get("operator", str)
        if operator not in OPERATORS:
            raise spec.fail("operator", "one of " + ", ".join(sorted(OPERATORS)), operator)
        options = {k: v for k, v in raw.items() if k != "operator"}
        try:
            OPERATORS[operator](**options)  # options an operator checks itself fail here, before any model runs
        except ConfigError as exc:
            raise ConfigError(f"{where}: families.{name}: {exc}") from None
        families.append(Family(str(name), operator, options))
    distractors: tuple[str, ...] = ()
    if "distractors" in f.data:
        path = Path(where).parent / f.get("distractors", str)
        if not path.is_file():
            raise f.fail("distractors", f"a sentence file next to the suite ({path} not found)")
        distractors = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return Suite(
        f.get("name", str, Path(where).stem),
        where,
        f.get("seed", int, 1234),
        threshold,
        variants,
        tuple(families),
        distractors,
    )


def seen_families(suite: Suite, search_suite: Suite | None) -> frozenset[str]:
    """Families of `suite` a search under `search_suite` has seen: the same name, or the same operator with
    any options (a search trained on one-character typos has seen typos, whatever their count or name).
    A family in both suites is allowed; it is reported as seen. No search suite: nothing is seen."""
    if search_suite is None:
        return frozenset()
    names = {f.name for f in search_suite.families}
    operators = {f.operator for f in search_suite.families}
    return frozenset(f.name for f in suite.families if f.name in names or f.operator in operators)


def builtin_suite_names() -> list[str]:
    return builtin_names(BUILTIN_DIR)


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name or a suite YAML by path."""
    return parse_suite(*load_named_yaml(name_or_path, BUILTIN_DIR, "suite"))
