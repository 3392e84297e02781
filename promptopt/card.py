"""Prompt card version 2: its JSON Schema (shipped as `card_schema.json`, documented field by field),
validation with errors that name the file and the field, and the canonical hashes export records and
verify re-computes.

Light on purpose — stdlib, yaml and jsonschema only — because production code reaches it through
`promptopt.load_prompt`, which must not import torch or transformers.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from promptopt.errors import ConfigError

CARD_V2 = 2
SCHEMA_PATH = Path(__file__).with_name("card_schema.json")
PROMPT_KEYS = ("task", "instruction", "template", "exemplars")


@lru_cache(maxsize=1)
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema())


def _field(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def validate_card(data: Any, where: str) -> None:
    """Raise one ConfigError naming the file and the first broken field (schema, then cross-field rules); when
    fields were edited after export (check.prompt_sha256, check.fields_sha256), the message says which."""
    try:
        _check_schema(data, where)
        _check_across_fields(data, where)
    except ConfigError as exc:
        edited = _edits_or_none(data)
        if edited:
            raise ConfigError(f"{exc} ({', '.join(edited)} edited after export)") from None
        raise


def _edits_or_none(data: Any) -> list[str]:
    """The edited fields of a card that may not even be valid: what can be told, else nothing."""
    try:
        return edited_fields(data) + (edited_scored_fields(data) or [])
    except (KeyError, TypeError, AttributeError, ValueError):
        return []


def _check_schema(data: Any, where: str) -> None:
    from jsonschema.exceptions import best_match

    error = best_match(_validator().iter_errors(data))
    if error is not None:
        path = list(error.absolute_path)
        if error.validator == "additionalProperties":  # name the unknown key itself
            known = set(error.schema.get("properties", {}))
            unknown = sorted(set(error.instance) - known)
            if unknown:
                raise ConfigError(
                    f"{where}: {_field(path + [unknown[0]])}: unknown key (allowed: {', '.join(sorted(known))})"
                )
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else error.message
            raise ConfigError(f"{where}: {_field(path + [missing])}: missing (required by card version 2)")
        raise ConfigError(f"{where}: {_field(path)}: {_describe(error)}")


def _check_across_fields(data: dict, where: str) -> None:
    test = data["metrics"]["test"]
    if "correct" in test and len(test["correct"]) != len(data["data"]["test_ids"]):
        raise ConfigError(
            f"{where}: metrics.test.correct: expected one character per data.test_ids entry "
            f"({len(data['data']['test_ids'])}), got {len(test['correct'])}"
        )
    if test["n"] != len(data["data"]["test_ids"]):
        raise ConfigError(
            f"{where}: metrics.test.n: expected {len(data['data']['test_ids'])} (the number of data.test_ids), got {test['n']}"
        )
    if (data["rendering"]["mode"] == "chat") != bool(data["template"].get("chat", False)):
        raise ConfigError(f"{where}: rendering.mode: {data['rendering']['mode']!r} disagrees with template.chat")
    if data["rendering"]["mode"] == "chat" and not data["rendering"].get("chat_template"):
        raise ConfigError(
            f"{where}: rendering.chat_template: expected the model's chat template for a chat card, got nothing"
        )
    if len(data["check"]["prompt_sha256"]["exemplars"]) != len(data["exemplars"]):
        raise ConfigError(
            f"{where}: exemplars: {len(data['exemplars'])} exemplars but check.prompt_sha256 recorded "
            f"{len(data['check']['prompt_sha256']['exemplars'])} (exemplars were added or removed after export)"
        )


def _describe(error) -> str:
    from promptopt.yamlio import shorten
    from promptopt.yamlio import shown as short_repr

    got = error.instance
    shown = short_repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if error.validator == "type":
        return f"expected {error.validator_value if isinstance(error.validator_value, str) else ' or '.join(error.validator_value)}, got {shown}"
    if error.validator in ("enum", "const"):
        options = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"expected one of {', '.join(map(repr, options))}, got {shown}"
    if error.validator in ("minItems", "maxItems"):
        bound = "at least" if error.validator == "minItems" else "at most"
        return f"expected {bound} {error.validator_value} items, got {len(got)}"
    if error.validator == "pattern":
        return f"expected a value matching {error.validator_value}, got {shown}"
    return shorten(error.message, 200)  # jsonschema's own message quotes the value whole


# --- canonical hashes -------------------------------------------------------------------------------
def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(value: Any) -> str:
    return sha256_text(json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")))


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (weights can be many GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def token_ids_sha256(ids: list[int]) -> str:
    return sha256_text(",".join(str(int(i)) for i in ids))


def prompt_hashes(card: dict) -> dict:
    """One hash per prompt field of a card mapping (instruction, template, each exemplar)."""
    return {
        "instruction": sha256_json(card.get("instruction", "")),
        "template": sha256_json(card.get("template", {})),
        "exemplars": [sha256_json(ex) for ex in card.get("exemplars", [])],
    }


def edited_fields(card: dict) -> list[str]:
    """The prompt fields whose content differs from what export recorded in check.prompt_sha256."""
    recorded, now = card["check"]["prompt_sha256"], prompt_hashes(card)
    changed = [key for key in ("instruction", "template") if recorded[key] != now[key]]
    changed += [f"exemplars[{i}]" for i, (a, b) in enumerate(zip(recorded["exemplars"], now["exemplars"])) if a != b]
    return changed


# Every field that decides a card's score or that verify reads, beyond the prompt fields: the task, every key of
# these sections, and each ensemble member's prompt and rule (check.fields_sha256, one hash per field).
# every section that decides the card's score, or what serving flags (fragility: the threshold a server applies)
HASHED_SECTIONS = ("rendering", "answer", "generation", "decision", "fragility", "model", "data", "metrics.test")
MEMBER_FIELDS = ("instruction", "template", "exemplars", "decision")
_ABSENT = sha256_json(None)  # a field that is absent reads as null: adding a null key is no edit


def _at(card: dict, dotted: str):
    value = card
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def field_values(card: dict) -> dict[str, Any]:
    """The scored fields of a card by name: `task`, `<section>.<key>` for every key of HASHED_SECTIONS (a section
    that is null or absent under its own name), `ensemble.aggregation` and `ensemble.members[i].<field>`."""
    out: dict[str, Any] = {"task": card.get("task")}
    for section in HASHED_SECTIONS:
        value = _at(card, section)
        if isinstance(value, dict):
            out.update({f"{section}.{key}": v for key, v in value.items()})
        else:
            out[section] = value
    ensemble = card.get("ensemble")
    if isinstance(ensemble, dict):
        out["ensemble.aggregation"] = ensemble.get("aggregation")
        for i, member in enumerate(ensemble.get("members") or []):
            for key in MEMBER_FIELDS:
                out[f"ensemble.members[{i}].{key}"] = member.get(key) if isinstance(member, dict) else member
    return out


def field_hashes(card: dict) -> dict[str, str]:
    """What export records in check.fields_sha256: the SHA-256 of each scored field's canonical JSON."""
    return {name: sha256_json(value) for name, value in field_values(card).items()}


def _sections(names) -> set[str]:
    """Every dotted prefix of `names` (`ensemble.members[1].decision` -> ensemble, ensemble.members[1])."""
    out = set()
    for name in names:
        parts = name.split(".")
        out.update(".".join(parts[:n]) for n in range(1, len(parts)))
    return out


def edited_scored_fields(card: dict) -> list[str] | None:
    """The scored fields whose content differs from check.fields_sha256, in card order; a section (or ensemble
    member) present on one side only is named whole. None for a card exported before these hashes existed."""
    recorded = (card.get("check") or {}).get("fields_sha256")
    if not isinstance(recorded, dict):
        return None
    now = field_hashes(card)
    one_sided = _sections(recorded) ^ _sections(now)
    changed: list[str] = []
    for name in [*now, *(n for n in recorded if n not in now)]:
        if recorded.get(name, _ABSENT) == now.get(name, _ABSENT):
            continue
        whole = [s for s in sorted(one_sided, key=len) if name.startswith(s + ".")]
        name = whole[0] if whole else name  # the outermost section that is new or gone
        if name not in changed:
            changed.append(name)
    return changed


def unchecked_fields(card: dict) -> str:
    """The scored fields, grouped by section, in words: `task, rendering.{mode,...}, ..., data.{...,test_ids}`
    (what a card exported before check.fields_sha256 cannot have checked)."""
    groups: dict[str, list[str]] = {}
    for name in field_values(card):
        section, _, key = name.rpartition(".")
        groups.setdefault(section or key, []).extend([key] if section else [])
    return ", ".join(f"{section}.{{{','.join(keys)}}}" if keys else section for section, keys in groups.items())


def v1_view(card: dict) -> dict:
    """The provenance mapping a version-1 reader expects (model spec, strategy, study, trial, seed, dev/test
    summaries), with the whole v2 card under `card`."""
    search = card.get("search") or {}
    view = {"task": card["task"], "model": card["model"]["spec"]}
    view.update({k: search[k] for k in ("strategy", "study", "trial", "seed") if k in search})
    view.update({k: card["metrics"][k] for k in ("dev", "test") if k in card["metrics"]})
    if "created" in card:
        view["created"] = card["created"]
    view["card"] = card
    return view
