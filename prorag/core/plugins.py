"""User plugins: modules outside the package that register methods, baselines or formats on import.

A plugin is any importable module whose import registers something (``@STEP_REWARD_SOURCES.register``,
``@EVAL_BASELINES.register``, ...). :func:`load_plugins` imports the modules named to it, those in
the environment variable ``PRORAG_PLUGINS`` (comma-separated) and those of the entry points of group
``prorag.plugins`` of installed packages; the command line calls it at start-up, before any config
is read, so the names a plugin registers are known to every command.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from importlib.metadata import entry_points

#: The environment variable listing plugin modules, comma-separated.
PLUGINS_ENV = "PRORAG_PLUGINS"
#: The entry-point group of installed plugins (``[project.entry-points."prorag.plugins"]``).
PLUGINS_GROUP = "prorag.plugins"


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import ``modules``, then ``$PRORAG_PLUGINS``'s, then the ``prorag.plugins`` entry points'
    (each once, in that order); return the names imported. A module that fails to import raises,
    naming it: a plugin asked for and missing is an error, not a method silently unknown."""
    names = [*modules, *(m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip())]
    names += [ep.value.split(":")[0] for ep in entry_points(group=PLUGINS_GROUP)]
    loaded: list[str] = []
    for name in dict.fromkeys(names):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"cannot import the prorag plugin {name!r}: {e}") from e
        loaded.append(name)
    return loaded


__all__ = ["PLUGINS_ENV", "PLUGINS_GROUP", "load_plugins"]
