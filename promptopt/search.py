"""Deprecated module path: `promptopt.search` is the search call (promptopt/api.py); the study package it was is
`promptopt.study`. Until the next release this module stands in for both: calling it runs `promptopt.api.search`,
and the old names (`from promptopt.search import run_search, SearchConfig`) come from `promptopt.study` with a
DeprecationWarning. It exists only for code that imports the old path: `promptopt.search` itself is the function.
"""

from __future__ import annotations

import importlib
import sys
import types
import warnings

from promptopt.moved import install


class _CallableModule(types.ModuleType):
    def __call__(self, **kwargs):
        return importlib.import_module("promptopt.api").search(**kwargs)


def __getattr__(name: str):
    study = importlib.import_module("promptopt.study")
    if name.startswith("__") or not hasattr(study, name):
        raise AttributeError(f"module 'promptopt.search' has no attribute {name!r}")
    warnings.warn(
        f"promptopt.search.{name} moved to promptopt.study.{name}; the old path goes in the next release "
        "(promptopt.search(...) is the search call)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(study, name)


sys.modules[__name__].__class__ = _CallableModule
__path__: list[str] = []  # a package, so that `promptopt.search.strategies` ... resolve through the finder below
install(lambda old: "promptopt.study" + old[len(__name__) :] if old.startswith(__name__ + ".") else None)
