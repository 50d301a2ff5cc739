"""A module imported when first used: ``torch = lazy_module("torch")`` in a module that must import
cheaply (a config, a registry that ``--help`` lists) while its functions compute with torch.

``prorag --help`` and ``prorag rl --help`` build their option lists from the configs and the
registries, which must therefore import without torch, transformers or TRL (seconds each). The
stand-in imports the real module on the first attribute read and forwards every read to it, so a
function body reads as usual; it touches nothing global (``sys.modules`` gets the real module
through a normal import). Module-level code must not read from it (a base class, a decorator,
a type alias): that would import at once, which ``tests/cli/test_help_speed.py`` catches. Type
checkers see the real module: import it under ``TYPE_CHECKING`` beside the stand-in.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """Stands in for the module ``name`` until an attribute is read; then imports and forwards."""

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Any, Any]:
    """``__getattr__`` and ``__dir__`` for a package whose public names live in its submodules
    (PEP 562): ``exports`` maps each name to its submodule (``".run"``), imported when the name is
    first read. ``from prorag.stages.rl.config import RLConfig`` then imports the config alone,
    not the trainer beside it, while ``from prorag.stages.rl import train_rl`` still works."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__


def lazy_module(name: str) -> Any:
    """The stand-in for ``import name`` (typed ``Any``: annotate with the real module under
    ``TYPE_CHECKING``)."""
    return LazyModule(name)


__all__ = ["LazyModule", "lazy_exports", "lazy_module"]
