"""The objects behind `in-memory:` specs (the Python API's `model=` objects, promptopt/models/memory.py): a table of
weak references, so the caller's variable keeps a model alive and a model the caller drops is freed. Kept apart from
memory.py so that load.py can resolve these specs without importing what builds them."""

from __future__ import annotations

import weakref
from typing import Any

from promptopt.errors import ModelNotFoundError

PREFIX = "in-memory:"
KINDS = ("model", "loaded", "runner")  # a Model's module + tokenizer, a LoadedModel, a ModelRunner


class Handle:
    """One object behind an `in-memory:` spec, of one of `KINDS`."""

    def __init__(self, spec: str, kind: str, obj: Any, tokenizer: Any = None) -> None:
        self.spec, self.kind, self.tokenizer = spec, kind, tokenizer
        try:
            self._ref = weakref.ref(obj)
        except TypeError:  # an object without weak references (__slots__) is kept alive instead
            self._ref = lambda obj=obj: obj
        self.made = None  # a weak reference to the LoadedModel made for a Model (load.py)

    def get(self) -> Any:
        return self._ref()


HANDLES: dict[str, Handle] = {}


def is_in_memory(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def add(name: str, kind: str, obj: Any, tokenizer: Any = None) -> str:
    """The spec of `obj`: the one it has already, else `in-memory:NAME` (`#2`, `#3` ... when the name is taken)."""
    for handle in list(HANDLES.values()):
        live = handle.get()
        if live is None:
            del HANDLES[handle.spec]
        elif live is obj and handle.kind == kind and handle.tokenizer is tokenizer:
            return handle.spec
    base = PREFIX + str(name).removeprefix(PREFIX)
    spec, n = base, 1
    while spec in HANDLES:
        n += 1
        spec = f"{base}#{n}"
    HANDLES[spec] = Handle(spec, kind, obj, tokenizer)
    return spec


def get(spec: str) -> tuple[Handle, Any]:
    """(handle, its live object); a spec whose object is gone (or was never passed here) is one line."""
    handle = HANDLES.get(spec)
    target = handle.get() if handle is not None else None
    if target is None:
        raise ModelNotFoundError(
            f"model '{spec}' was passed as an object and is not in this process (any more): an in-memory model lives "
            "in the Python process it was passed in; pass the object again, or save it (save_pretrained) and give "
            "its folder"
        )
    return handle, target


def module(spec: str):
    """The torch module behind `spec` (a runner's or LoadedModel's `model`)."""
    handle, target = get(spec)
    return target if handle.kind == "model" else (target.lm if handle.kind == "runner" else target).model


__all__ = ["HANDLES", "PREFIX", "Handle", "add", "get", "is_in_memory", "module"]
