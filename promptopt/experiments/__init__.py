"""Deprecated: `promptopt.experiments` was split by kind in 0.2 and goes in the next release.

The product's workflows are in `promptopt.workflows`, the HTML report in `promptopt.report`, the papers'
analyses in `promptopt.analyses`; a Python user's entry points are `promptopt.search`, `compare`, `export`,
`verify` and `load_prompt`. Until then every old path (`promptopt.experiments.compare`, `from
promptopt.experiments import run_compare`, ...) gives the module or object at its new place, with a
DeprecationWarning that names it. The alias is a meta-path finder: nothing is imported before it is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=3)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import promptopt.experiments.X.Y` -> the module at X's new place, registered under the old name too."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if _new_name(fullname) else None

    def create_module(self, spec):
        new = _new_name(spec.name)
        _warn(spec.name, new)
        module = importlib.import_module(new)
        self._spec = module.__spec__  # the import system stamps the alias's spec on it; exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def __getattr__(name: str):
    if name in _OBJECTS:
        _warn(f"promptopt.experiments.{name}", f"{_OBJECTS[name]}.{name}")
        return getattr(importlib.import_module(_OBJECTS[name]), name)
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
