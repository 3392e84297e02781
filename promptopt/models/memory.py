"""Models passed as objects (the Python API's `model=`): a loaded transformers model with its tokenizer, or any
`ModelRunner`, used as they are, in this process.

Everything downstream names its model by a spec string (configs, study attributes, cards), so an object gets one:
`in-memory:<its name>` (`#2`, `#3` ... for another object of the same name), held by weak reference
(models/handles.py): the caller's variable keeps it alive, and a model the caller drops is freed. The spec means
nothing to another process: worker processes cannot use it, and a card measured on it records a fingerprint of the
weights as they are in memory (`tensors_sha256`), which `verify` checks when given the model again.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from promptopt.errors import ConfigError
from promptopt.models import handles
from promptopt.models.api import ModelRunner
from promptopt.models.load import LoadedModel

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


def register(obj: Any) -> str:
    """The spec that names `obj` (a Model, a (model, tokenizer) pair, a LoadedModel or a ModelRunner) in this process;
    the same object always gets the same spec. A string is returned as it is (a spec already)."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2:
        obj = Model(*obj)
    if isinstance(obj, Model):
        return handles.add(obj.name, "model", obj.model, obj.tokenizer)
    if isinstance(obj, LoadedModel):
        return handles.add(obj.name, "loaded", obj)
    if isinstance(obj, ModelRunner):
        return handles.add(getattr(obj.lm, "name", type(obj).__name__), "runner", obj)
    raise ConfigError(
        "model: expected a model spec (a name, folder, .gguf file or hub id), promptopt.Model(model, tokenizer), "
        f"a (model, tokenizer) pair or a ModelRunner, got {type(obj).__name__}"
    )


def fingerprint(spec: str) -> dict:
    """{kind: memory, weights_sha256, weights_method} of the object behind `spec` (`tensors_sha256`)."""
    return {"kind": "memory", "weights_sha256": tensors_sha256(handles.module(spec)), "weights_method": METHOD}


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


__all__ = ["METHOD", "Model", "fingerprint", "register", "tensors_sha256"]
