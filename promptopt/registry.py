"""One shape for every extension point: strategies, perturbation families (operators), answer types, decision
rules and model loaders are each a `Registry`.

An entry comes from one of three places, looked up in this order:
- registered in-process: `@STRATEGIES.register` on a class or object, or `REGISTRY.register(obj, name=...)`;
- built in: named by the registry as "module:attribute" and imported on first use, so a registry never imports the
  modules it lists (no import cycles, and `--help` lists names without loading torch);
- installed: a Python entry point in the registry's group, so a package of your own adds one by declaring, in its
  pyproject.toml, e.g. ``[project.entry-points."promptopt.strategies"] mine = "my_pkg.strategies:MINE"``.

The CLI's help texts and the docs list `Registry.names()`, never a hand-written copy.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Generic, TypeVar

from promptopt.errors import ConfigError

T = TypeVar("T")

ENTRY_POINT_PREFIX = "promptopt."


def load_reference(reference: str) -> Any:
    """The object a "module:attribute" reference names.

    Args:
        reference: "package.module:attribute" (the attribute may be dotted; without one, the module).

    Raises:
        ModuleNotFoundError: the module is not installed.
        AttributeError: the module has no such attribute.
    """
    module, _, attribute = reference.partition(":")
    value = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    """Named extensions of one kind. `make` turns what is registered into the entry (e.g. a class into its
    instance); `name_of` reads an entry's name when `register` is not given one.

    Args:
        kind: what an entry is, as messages say it ("strategy", "decision rule").
        group: the entry-point group installed packages add entries through ("promptopt.strategies").
        builtins: name -> "module:attribute" of the built-in entries, imported on first use.
        make: turns what is registered into the entry (default: itself).
        name_of: an entry's name when `register` is given none (default: its `.name`).
    """

    def __init__(
        self,
        kind: str,
        *,
        group: str,
        builtins: dict[str, str] | None = None,
        make: Callable[[Any], T] | None = None,
        name_of: Callable[[Any], str] | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self._builtins = dict(builtins or {})
        self._make = make or (lambda obj: obj)
        self._name_of = name_of or (lambda obj: obj.name)
        self._entries: dict[str, T] = {}
        self._entry_points: dict[str, metadata.EntryPoint] | None = None

    # --- adding ------------------------------------------------------------------------------------
    def register(self, obj: Any = None, *, name: str | None = None, replace: bool = False) -> Any:
        """Add `obj` (usable as a decorator, with or without arguments).

        Args:
            obj: the entry (or what `make` turns into it); None: return a decorator.
            name: its name (default: `name_of(obj)`, e.g. its `.name`).
            replace: replace an entry of that name registered in this process.

        Returns:
            `obj` unchanged.

        Raises:
            ValueError: another entry is registered under that name and `replace` is False.
        """
        if obj is None:
            return lambda o: self.register(o, name=name, replace=replace)
        entry = self._make(obj)
        key = name or self._name_of(obj)
        if not replace and key in self._entries and self._entries[key] is not entry:
            raise ValueError(f"{self.kind} {key!r} is registered already (pass replace=True to replace it)")
        self._entries[key] = entry
        return obj

    def unregister(self, name: str) -> None:
        """Remove an entry registered in this process (built-in and installed names stay)."""
        self._entries.pop(name, None)

    def __setitem__(self, name: str, obj: Any) -> None:  # dict-like, for tests that swap an entry
        self.register(obj, name=name, replace=True)

    def __delitem__(self, name: str) -> None:
        self.unregister(name)

    # --- looking up --------------------------------------------------------------------------------
    def _installed(self) -> dict[str, metadata.EntryPoint]:
        if self._entry_points is None:
            self._entry_points = {ep.name: ep for ep in metadata.entry_points(group=self.group)}
        return self._entry_points

    def refresh(self) -> None:
        """Read the installed entry points again (after installing a package into a running process)."""
        self._entry_points = None

    def provider(self, name: str) -> str | None:
        """The distribution (pip package) whose entry point installs `name`; None for a built-in or an entry
        registered in-process. A card records it, so a reader without the package is told which to install.

        Args:
            name: a registered name.

        Returns:
            The distribution's name, or None.
        """
        if name in self._builtins or name in self._entries and name not in self._installed():
            return None
        installed = self._installed().get(name)
        dist = getattr(installed, "dist", None) if installed is not None else None
        return getattr(dist, "name", None) or None

    def names(self) -> tuple[str, ...]:
        """Every name this registry answers to: built-ins first, in their order, then registered, then installed."""
        seen = dict.fromkeys([*self._builtins, *self._entries, *self._installed()])
        return tuple(seen)

    def get(self, name: str, where: str | None = None) -> T:
        """The entry called `name`: registered in-process, else built in, else installed.

        Args:
            name: the entry's name.
            where: what the error names as the place of the unknown name (a file and field, an option).

        Returns:
            The entry.

        Raises:
            ConfigError: an unknown name (naming `where`, every registered name and the nearest), or an installed
                package's entry point that fails to load.
        """
        if name in self._entries:
            return self._entries[name]
        if name in self._builtins:
            self._entries[name] = self._make(load_reference(self._builtins[name]))
            return self._entries[name]
        installed = self._installed().get(name)
        if installed is not None:
            try:
                self._entries[name] = self._make(installed.load())
            except Exception as exc:  # an installed package's bug: say which one, in one line
                raise ConfigError(
                    f"{self.kind} {name!r} from entry point {installed.value!r} ({self.group}) failed to load: {exc}"
                ) from exc
            return self._entries[name]
        raise ConfigError(self.unknown(name, where))

    def unknown(self, name: str, where: str | None = None) -> str:
        """The one-line message for an unknown `name`: the registered names, and the nearest one if any."""
        names = self.names()
        near = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return f"{where + ': ' if where else ''}unknown {self.kind} {name!r}{hint}: use one of {', '.join(names)}"

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, T]]:
        return [(name, self.get(name)) for name in self.names()]

    def values(self) -> list[T]:
        return [self.get(name) for name in self.names()]
