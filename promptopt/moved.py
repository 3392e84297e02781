"""Old import paths kept for one release: a meta-path finder that answers `import OLD.X.Y` with the module at its
new place (registered under the old name too), with a DeprecationWarning naming the new path. Nothing is imported
before it is asked for."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable


def warn_moved(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=stacklevel
    )


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`new_name(old)` -> the new dotted name, or None for a name this finder does not answer."""

    def __init__(self, new_name: Callable[[str], str | None]) -> None:
        self.new_name = new_name
        self._specs: dict[int, object] = {}

    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if self.new_name(fullname) else None

    def create_module(self, spec):
        new = self.new_name(spec.name)
        warn_moved(spec.name, new, stacklevel=4)
        module = importlib.import_module(new)
        self._specs[id(module)] = module.__spec__  # the import system stamps the alias's spec on it: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs.pop(id(module), module.__spec__)


def install(new_name: Callable[[str], str | None]) -> None:
    sys.meta_path.insert(0, MovedModules(new_name))
