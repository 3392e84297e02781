"""Deprecated: `promptopt.experiments` was split by kind in 0.2 and goes in the next release.

The product's workflows are in `promptopt.workflows`, the HTML report in `promptopt.report`, the papers'
analyses in `promptopt.analyses`; a Python user's entry points are `promptopt.study`, `compare`, `export`,
`verify` and `load_prompt`. Until then every old path (`promptopt.experiments.compare`, `from
promptopt.experiments import run_compare`, ...) gives the module or object at its new place, with a
DeprecationWarning that names it (promptopt/moved.py).
"""

from __future__ import annotations

import importlib
import sys

from promptopt.moved import install, warn_moved

_MOVED = {
    **{
        name: f"promptopt.workflows.{name}"
        for name in ("session", "fingerprint", "formats", "ensemble", "verify", "pair_runs", "compare", "export")
    },
    "propose": "promptopt.workflows.propose",
    "report": "promptopt.report",
    **{
        name: f"promptopt.analyses.{name}"
        for name in ("diagnose", "proxy", "item_auroc", "risk_coverage", "stress_sweep", "lmeval_check", "lmeval_run")
    },
}
_OBJECTS = {"Session": "promptopt.workflows.session", "run_compare": "promptopt.workflows.compare"}


def _new_name(old: str) -> str | None:
    parts = old.split(".")
    if parts[:2] != ["promptopt", "experiments"] or len(parts) < 3 or parts[2] not in _MOVED:
        return None
    return ".".join([_MOVED[parts[2]], *parts[3:]])


if not getattr(sys.modules[__name__], "_installed", False):
    install(_new_name)
    _installed = True


def __getattr__(name: str):
    if name in _OBJECTS:
        warn_moved(f"promptopt.experiments.{name}", f"{_OBJECTS[name]}.{name}")
        return getattr(importlib.import_module(_OBJECTS[name]), name)
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
