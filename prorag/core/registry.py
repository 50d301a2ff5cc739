"""Named registries: how a new method plugs in without an edit to the code that uses it.

A registry maps a name (what a config or the command line says, e.g. ``advantage: cpgrpo``) to an
object (a function, a class, a factory). A method registers itself where it is defined, as verl's
``register_adv_est`` does: ``@ADVANTAGES.register("cpgrpo", help="...")``, with its own settings
class if it has settings (``config=CPSearchConfig``: the configs that select the method then hold
a section of that name, :func:`~prorag.core.config.method_settings`). The user of a registry only
ever calls ``REGISTRY.get(name)``, and help texts list ``REGISTRY.describe()``.

``builtins`` names modules imported before the first look-up, so that built-in methods register
without the user importing each. It may name modules of the registry's own layer or below only
(``tests/test_layers.py``): a layer above registers its methods when it is imported, by whatever
uses them (the stage), never by a string a lower layer imports.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """What a name is registered with beside its object: the method's own settings class (a config
    dataclass; ``None`` for a method without settings) and a one-line description for help texts."""

    config: type | None = None
    help: str = ""


#: ``watcher(name, entry)``: told of every registration (:meth:`Registry.watch`).
Watcher = Callable[[str, Entry], None]


def first_line(doc: str | None) -> str:
    """The first sentence-line of a docstring (the description of an entry registered without one)."""
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ").strip()


def unknown_name(what: str, name: object, known: list[str]) -> str:
    """The error message of a name not among ``known``: ``unknown WHAT 'x'; expected one of
    [...]; did you mean 'y'?`` (the closest known name, when one is close)."""
    close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {name!r}; expected one of {known}{hint}"


class Registry(Generic[T]):
    """Names to objects of one kind; ``what`` names the kind in error messages."""

    def __init__(self, what: str, builtins: tuple[str, ...] = ()) -> None:
        self.what = what
        self._builtins = builtins
        self._loaded = not builtins
        self._entries: dict[str, T] = {}
        self._meta: dict[str, Entry] = {}
        self._watchers: list[Watcher] = []

    def register(
        self, name: str, *, config: type | None = None, help: str | None = None, replace: bool = False
    ) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("name", help="...")`` over a function or class; ``config``
        is the method's settings class, ``help`` a one-line description (default: the first
        paragraph of the object's docstring). Registering a taken name is an error unless
        ``replace`` (a user overriding a built-in on purpose)."""

        def add(obj: T) -> T:
            if name in self._entries and not replace and self._entries[name] is not obj:
                raise ValueError(f"{self.what} {name!r} is already registered")
            entry = Entry(config, help if help is not None else first_line(getattr(obj, "__doc__", None)))
            for watcher in self._watchers:  # before the name is taken: a watcher that refuses it leaves no trace
                watcher(name, entry)
            self._entries[name], self._meta[name] = obj, entry
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
            raise ValueError(unknown_name(self.what, name, self.names()))
        return self._entries[name]

    def check(self, name: str, field: str) -> None:
        """Refuse a config's ``field`` (``RLConfig.advantage``) holding a name not registered, with
        :meth:`get`'s message after the field: the known names and the closest one."""
        if not (isinstance(name, str) and name in self):
            raise ValueError(f"{field}: {unknown_name(self.what, name, self.names())}")

    def entry(self, name: str) -> Entry:
        """The settings class and description ``name`` was registered with (unknown: as :meth:`get`)."""
        self.get(name)
        return self._meta[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        self._load_builtins()
        return list(self._entries)

    def describe(self) -> str:
        """Each name with its description, for help texts: ``\\`a\\`: does A; \\`b\\`: does B``."""
        return "; ".join(f"`{name}`: {self._meta[name].help}" if self._meta[name].help else f"`{name}`" for name in self.names())

    def watch(self, watcher: Watcher) -> None:
        """Call ``watcher(name, entry)`` for every registered name now (built-ins loaded) and for
        every later registration (a plugin's): how a config learns the settings of new methods."""
        self._load_builtins()
        self._watchers.append(watcher)
        for name in list(self._entries):
            watcher(name, self._meta[name])

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


__all__ = ["Entry", "Registry", "Watcher", "first_line", "unknown_name"]
