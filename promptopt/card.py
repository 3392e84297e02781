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
    """Raise one ConfigError naming the file and the first broken field (schema, then cross-field rules)."""
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
    got = error.instance
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if error.validator == "type":
        return f"expected {error.validator_value if isinstance(error.validator_value, str) else ' or '.join(error.validator_value)}, got {shown}"
    if error.validator in ("enum", "const"):
        options = error.validator_value if error.validator == "enum" else [error.validator_value]
        return f"expected one of {', '.join(map(repr, options))}, got {shown}"
    if error.validator == "pattern":
        return f"expected a value matching {error.validator_value}, got {shown}"
    return error.message


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
