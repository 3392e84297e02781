"""Models passed as objects (the Python API's `model=`): a loaded transformers model with its tokenizer, or any
`ModelRunner`, used as they are, in this process.

Everything downstream names its model by a spec string (configs, study attributes, cards), so an object gets one:
`in-memory:<its name>` (`#2`, `#3` ... for another object of the same name). It is held here by weak reference, so
the caller's variable keeps it alive and a model the caller drops is freed. The spec means nothing to another
process: worker processes cannot use it, and a card measured on it records a fingerprint of the weights as they
are in memory (`fingerprint`: SHA-256 over the parameter tensors), which `verify` checks when given the model again.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

import torch

from promptopt.errors import ConfigError, ModelNotFoundError, UnsupportedError
from promptopt.models.load import LoadedModel, quantization_info, quantize_of, verify_geometry

PREFIX = "in-memory:"
METHOD = "in-memory-tensors"  # what a card's model.weights_method says for these fingerprints


class Model:
    """A loaded transformers causal LM and its tokenizer, as the Python API's `model=` takes them (the pair
    `(model, tokenizer)` means the same). The model is used where it is (its device, dtype, quantization) and put in
    eval mode; its tokenizer is not changed. `name` is what runs and cards call it (default: the model's
    `name_or_path`, else its class name), after `in-memory:`."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, name: str | None = None) -> None:
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_output_embeddings"):
            raise ConfigError(f"model: expected a transformers model (a torch.nn.Module), got {type(model).__name__}")
        if not callable(getattr(tokenizer, "encode", None)):
            raise ConfigError(f"model: expected a tokenizer beside the model, got {type(tokenizer).__name__}")
        self.model, self.tokenizer = model, tokenizer
        config = getattr(model, "config", None)
        self.name = str(name or getattr(config, "name_or_path", "") or type(model).__name__)

    def __repr__(self) -> str:
        return f"Model({self.name!r})"


class _Handle:
    """One object behind an `in-memory:` spec: a Model's module (weakly) and tokenizer, a LoadedModel or a runner."""

    def __init__(self, spec: str, kind: str, obj: Any, tokenizer: Any = None) -> None:
        self.spec, self.kind, self.tokenizer = spec, kind, tokenizer
        try:
            self._ref = weakref.ref(obj)
        except TypeError:  # an object without weak references (__slots__) is kept alive instead
            self._ref = lambda obj=obj: obj
        self._loaded = None  # weakref to the LoadedModel made for a Model

    def get(self) -> Any:
        return self._ref()


_HANDLES: dict[str, _Handle] = {}


def is_in_memory(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def register(obj: Any) -> str:
    """The spec that names `obj` (a Model, a (model, tokenizer) pair, a LoadedModel or a ModelRunner) in this process;
    the same object always gets the same spec. A string is returned as it is (a spec already)."""
    from promptopt.models.api import ModelRunner

    if isinstance(obj, str):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2:
        obj = Model(*obj)
    if isinstance(obj, Model):
        kind, target, tokenizer, name = "model", obj.model, obj.tokenizer, obj.name
    elif isinstance(obj, LoadedModel):
        kind, target, tokenizer, name = "loaded", obj, None, obj.name
    elif isinstance(obj, ModelRunner):
        kind, target, tokenizer, name = "runner", obj, None, getattr(obj.lm, "name", type(obj).__name__)
    else:
        raise ConfigError(
            "model: expected a model spec (a name, folder, .gguf file or hub id), promptopt.Model(model, tokenizer), "
            f"a (model, tokenizer) pair or a ModelRunner, got {type(obj).__name__}"
        )
    for handle in list(_HANDLES.values()):
        live = handle.get()
        if live is None:
            del _HANDLES[handle.spec]
        elif live is target and handle.kind == kind and handle.tokenizer is tokenizer:
            return handle.spec
    base = PREFIX + str(name).removeprefix(PREFIX)
    spec, n = base, 1
    while spec in _HANDLES:
        n += 1
        spec = f"{base}#{n}"
    _HANDLES[spec] = _Handle(spec, kind, target, tokenizer)
    return spec


def _handle(spec: str) -> tuple[_Handle, Any]:
    handle = _HANDLES.get(spec)
    target = handle.get() if handle is not None else None
    if target is None:
        raise ModelNotFoundError(
            f"model '{spec}' was passed as an object and is not in this process (any more): an in-memory model lives "
            "in the Python process it was passed in; pass the object again, or save it (save_pretrained) and give "
            "its folder"
        )
    return handle, target


def check(spec: str) -> None:
    """The object behind `spec` is alive in this process."""
    _handle(spec)


def runner(spec: str):
    """The ModelRunner passed as `spec`'s object, or None when it was a model (promptopt runs it with its Runner)."""
    handle, target = _handle(spec)
    return target if handle.kind == "runner" else None


def loaded(spec: str) -> LoadedModel:
    """The LoadedModel for `spec`'s object: a runner's `lm`, a LoadedModel itself, or one made (once, while the
    model lives) from a Model, with its output head checked as `load_model` checks it."""
    handle, target = _handle(spec)
    if handle.kind == "runner":
        return target.lm
    if handle.kind == "loaded":
        return target
    made = handle._loaded() if handle._loaded is not None else None
    if made is not None:
        return made
    model, tokenizer = target, handle.tokenizer
    model.eval()  # dropout off: a score is a property of the weights
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    context = getattr(cfg, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", None) or 2048
    device = next(model.parameters()).device
    made = LoadedModel(model=model, tokenizer=tokenizer, name=spec, device=device, context_length=int(context))
    verify_geometry(made)
    handle._loaded = weakref.ref(made)
    return made


def _module(spec: str) -> torch.nn.Module:
    handle, target = _handle(spec)
    return target if handle.kind == "model" else (target.lm if handle.kind == "runner" else target).model


def check_options(spec: str, *, device: str, dtype: str | None, quantize: str | None) -> None:
    """An in-memory model is used as it is: a device, dtype or quantization that differs from what it is now is a
    one-line error (convert the model before passing it), not a silent conversion of the caller's model."""
    model = _module(spec)
    first = next(model.parameters())
    now_dtype = str(first.dtype).removeprefix("torch.")
    now_quantize = quantize_of(quantization_info(model))
    if device != "auto" and torch.device(device).type != first.device.type:
        raise UnsupportedError(f"device {device}: {spec} is on {first.device.type} (move the model before passing it)")
    if dtype not in (None, "auto") and dtype != now_dtype and now_quantize is None:
        raise UnsupportedError(f"dtype {dtype}: {spec} computes in {now_dtype} (convert the model before passing it)")
    if quantize not in (None, now_quantize):
        raise UnsupportedError(
            f"quantize {quantize}: {spec} is {'in full precision' if now_quantize is None else now_quantize} "
            "(quantize the model before passing it)"
        )


def device_type(spec: str) -> str:
    return next(_module(spec).parameters()).device.type


def dtype_name(spec: str) -> str:
    return str(next(_module(spec).parameters()).dtype).removeprefix("torch.")


def fingerprint(spec: str) -> dict:
    """{kind: memory, weights_sha256, weights_method} of the object behind `spec` (`tensors_sha256`)."""
    return {"kind": "memory", "weights_sha256": tensors_sha256(_module(spec)), "weights_method": METHOD}


def tensors_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of the model's state dict (name, dtype, shape, bytes) as it is in memory: the same
    weights in another process, or saved and loaded again in the same dtype, give the same digest. It costs one pass
    over the weights (about a second per GB on a CPU, plus the copy off a GPU)."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not isinstance(tensor, torch.Tensor):  # a quantizer's extra state
                digest.update(f"{name}|{tensor!r}|".encode())
                continue
            flat = tensor.detach().reshape(-1).contiguous().cpu()
            digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


__all__ = ["METHOD", "PREFIX", "Model", "fingerprint", "is_in_memory", "loaded", "register", "runner", "tensors_sha256"]
