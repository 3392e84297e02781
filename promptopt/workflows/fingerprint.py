"""Fingerprints that tell whether a model, tokenizer, task or data set is the one a card was measured
with — computed at export, re-computed by verify.

Weights: a GGUF file's SHA-256; a Hugging Face folder's config.json plus each weight file's SHA-256
(above 8 GiB of weights: each safetensors header and size instead, so a 70B model is not read in full).
File hashes are cached by (path, size, mtime) under the promptopt cache, because hashing the same 100 MB
on every export and verify is slow. Tokenizer: its canonical JSON (vocabulary, merges, normalizer,
pre-tokenizer, added tokens) and special tokens, so a re-saved copy of the same tokenizer matches.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import struct
from pathlib import Path

from promptopt.card import sha256_file, sha256_json, sha256_text
from promptopt.errors import ModelNotFoundError
from promptopt.yamlio import atomic_write_text

FULL_HASH_LIMIT = 8 * 1024**3  # bytes of weights hashed in full; above it, safetensors headers and sizes
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _cache_file() -> Path:
    from promptopt.models.load import cache_root

    return cache_root() / "fingerprints.json"


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, cached by (resolved path, size, mtime)."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    cache[key] = sha256_file(path)
    try:
        atomic_write_text(cache_path, json.dumps(cache, indent=0))
    except OSError:
        pass  # a read-only cache only costs time
    return cache[key]


def _safetensors_header(path: Path) -> str:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return hashlib.sha256(handle.read(length)).hexdigest()


def folder_fingerprint(folder: Path) -> tuple[str, str]:
    """(sha256, method) of a Hugging Face model folder: config.json + weight files."""
    config = folder / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(f"model folder {folder} has no config.json")
    weights = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not weights:
        raise ModelNotFoundError(f"model folder {folder} has no weight files")
    config_data = json.loads(config.read_text(encoding="utf-8"))
    config_data.pop("_name_or_path", None)
    config_data.pop("transformers_version", None)  # written by whichever version saved it
    total = sum(p.stat().st_size for p in weights)
    if total <= FULL_HASH_LIMIT:
        parts = {p.name: file_sha256(p) for p in weights}
        method = "folder-files"
    else:
        parts = {
            p.name: (_safetensors_header(p) if p.suffix == ".safetensors" else "", p.stat().st_size) for p in weights
        }
        method = "folder-index"
    return sha256_json({"config": config_data, "weights": parts}), method


def model_fingerprint(spec: str) -> dict:
    """{kind, weights_sha256, weights_method} of a model spec, without loading the model (an in-memory model: over
    its tensors as they are, models/memory.py)."""
    from promptopt.models.load import _resolve

    kind, location, gguf_file = _resolve(spec)
    if kind == "memory":
        from promptopt.models import memory

        return memory.fingerprint(spec)
    if kind == "gguf":
        return {
            "kind": "gguf",
            "weights_sha256": file_sha256(Path(location) / gguf_file),
            "weights_method": "gguf-file",
        }
    if kind == "dir":
        digest, method = folder_fingerprint(Path(location))
        return {"kind": "dir", "weights_sha256": digest, "weights_method": method}
    try:  # a hub id: the snapshot already downloaded into the Hugging Face cache
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(str(location), local_files_only=True))
    except Exception as exc:  # not downloaded, or no such repository
        raise ModelNotFoundError(
            f"model '{spec}' is not in the local Hugging Face cache ({type(exc).__name__})"
        ) from None
    digest, method = folder_fingerprint(folder)
    return {"kind": "hub", "weights_sha256": digest, "weights_method": method}


def tokenizer_sha256(tokenizer) -> str:
    """Hash of what decides token ids: the backend's canonical JSON (fast tokenizers) or the vocabulary,
    plus the special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = json.loads(backend.to_str())
    else:
        body = sorted(tokenizer.get_vocab().items())
    return sha256_json(
        {
            "tokenizer": body,
            "special": tokenizer.special_tokens_map,
            "class": type(tokenizer).__name__.removesuffix("Fast"),
        }
    )


def chat_template_sha256(tokenizer) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    return sha256_text(template) if isinstance(template, str) and template else None


def _data_paths(spec, subsets) -> list[Path] | None:
    """The source files the task's splits come from (None for a hub dataset)."""
    import importlib.util

    subsets = list(subsets) if subsets else list(spec.source.subsets or [None])
    paths: list[Path] = []
    for subset in subsets:
        sub = (lambda text, subset=subset: text.replace("{subset}", subset)) if subset else (lambda text: text)
        for split in sorted({s.source_split for s in spec.splits.values()}):
            if split in spec.source.files:
                path = Path(sub(spec.source.files[split])).expanduser()
                paths.append(path if path.is_absolute() else Path(spec.where).parent / path)
            elif spec.source.package and importlib.util.find_spec(spec.source.package):
                root = Path(list(importlib.util.find_spec(spec.source.package).submodule_search_locations)[0])
                location = root / sub(spec.source.path)
                if location.is_file():
                    paths.append(location)
                else:
                    paths.extend(sorted(p for p in (location / split).rglob("*") if p.is_file()))
            else:
                return None
    return paths


def data_sha256(spec, subsets=None) -> str | None:
    """SHA-256 over the task's source data files (name and hash of each); None for hub datasets."""
    paths = _data_paths(spec, subsets)
    if not paths:
        return None
    return sha256_json([[p.name, file_sha256(p)] for p in paths])


def items_sha256(data) -> str:
    """SHA-256 over the carved items' content, role by role."""
    from promptopt.tasks.item import items_sha256 as role_sha256

    return sha256_json({role: role_sha256(data.split(role)) for role in ("pool", "dev", "test")})


def task_sha256(spec) -> str:
    return sha256_text(Path(spec.where).read_text(encoding="utf-8"))


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("promptopt", "torch", "transformers", "tokenizers", "optuna", "jinja2"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


__all__ = [
    "chat_template_sha256",
    "data_sha256",
    "file_sha256",
    "folder_fingerprint",
    "items_sha256",
    "model_fingerprint",
    "task_sha256",
    "tokenizer_sha256",
    "versions",
]
