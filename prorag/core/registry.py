"""Named registries: how a new method plugs in without an edit to the code that uses it.

A registry maps a name (what a config or the command line says, e.g. ``advantage: cpgrpo``)
to an object (a function, a class, a factory). A method registers itself where it is defined,
``@ADVANTAGES.register("cpgrpo")``, as verl's ``register_adv_est`` does; the trainer only ever
calls ``ADVANTAGES.get(config.advantage)``. A registry may also name modules to import before
its first look-up (``builtins``), so that the built-in methods are registered without the user
of the registry importing each of them, and without an import cycle between layers.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names to objects of one kind; ``what`` names the kind in error messages."""

    def __init__(self, what: str, builtins: tuple[str, ...] = ()) -> None:
        self.what = what
        self._builtins = builtins
        self._loaded = not builtins
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name")`` over a function or class. Registering a
        taken name is an error unless ``replace`` (a user overriding a built-in on purpose)."""

        def add(obj: T) -> T:
            if name in self._entries and not replace and self._entries[name] is not obj:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._entries[name] = obj
            return obj

        return add

    def _load_builtins(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self._builtins:
                importlib.import_module(module)

    def get(self, name: str) -> T:
        """The object registered as ``name``; an unknown name is a ``ValueError`` that lists the
        known ones and suggests the closest."""
        self._load_builtins()
        if name not in self._entries:
            close = difflib.get_close_matches(name, list(self._entries), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown {self.what} {name!r}; expected one of {self.names()}{hint}")
        return self._entries[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        self._load_builtins()
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


__all__ = ["Registry"]
