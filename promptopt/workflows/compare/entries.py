"""What a compare compares: entries `strategy` or `strategy@rule` (a search whose trials decide by a decision
rule, promptopt/decision.py), and ensembles built from an entry's trials (`<entry>+ens<K>`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from promptopt.decision import parse_rule
from promptopt.errors import ConfigError
from promptopt.study import get_strategy


@dataclass(frozen=True)
class Entry:
    name: str  # as written and shown: accuracy, accuracy@batch, tcb@affine:acc_norm
    strategy: str
    decision: str | None  # None: the space's decision dimension, else argmax

    @property
    def study_label(self) -> str:
        """The name's form allowed in a study name (letters, digits, '_', '-', '.', ':')."""
        return self.name.replace("@", ".")


def parse_entries(names: list[str]) -> list[Entry]:
    """`accuracy,accuracy@batch` -> entries; a typo in a strategy or a rule fails here, before anything runs."""
    if not names or len(set(names)) != len(names):
        raise ConfigError(f"strategies: expected distinct names, got {names}")
    entries = []
    for name in names:
        strategy, _, decision = name.partition("@")
        get_strategy(strategy)
        if decision:
            parse_rule(decision)
        entries.append(Entry(name, strategy, decision or None))
    return entries


ENSEMBLE_SUFFIX = re.compile(r"\+ens\d+$")  # how an ensemble entry's name ends (ensemble_name)


def ensemble_name(entry: str, k: int) -> str:
    return f"{entry}+ens{k}"


__all__ = ["ENSEMBLE_SUFFIX", "Entry", "ensemble_name", "parse_entries"]
