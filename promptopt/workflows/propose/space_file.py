"""A space file with proposals: the given space's YAML, its instructions extended with the accepted
proposals and a `proposals:` block recording where each came from (study/space.py reads it back)."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from promptopt.study.space import BUILTIN_DIR, SearchSpace, parse_space
from promptopt.yamlio import atomic_write_text, load_named_yaml


def read_space(name_or_path: str) -> tuple[dict, SearchSpace]:
    """The space's YAML mapping (kept as written) and the parsed space."""
    raw, where = load_named_yaml(name_or_path, BUILTIN_DIR, "search space")
    return raw, parse_space(raw, where)


def with_proposals(raw: dict, proposals, note: str) -> dict:
    """`raw` plus the accepted proposals (instruction name -> text, and their provenance)."""
    data = copy.deepcopy(raw)
    data["instructions"] = {**raw["instructions"], **{p.name: p.text for p in proposals.accepted}}
    data["proposals"] = {**(raw.get("proposals") or {}), **{p.name: p.provenance for p in proposals.accepted}}
    data["description"] = f"{raw.get('description', '').strip()} {note}".strip()
    return data


def write_space(data: dict, path: str | Path) -> SearchSpace:
    """Validate the mapping as a space, then write it atomically; returns the space it parses to."""
    space = parse_space(data, str(path))
    atomic_write_text(Path(path), yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000))
    return space


def record_path(space_path: str | Path) -> Path:
    """Where the record of a space's proposals goes: beside the space, `<name>.proposals.json` (a pending space
    `space.yaml.pending` is recorded for the name it will get, `space.proposals.json`)."""
    path = Path(space_path)
    if path.suffix == ".pending":
        path = path.with_suffix("")
    return path.with_suffix(".proposals.json")
