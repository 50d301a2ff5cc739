"""Plugins: a user's modules imported before a command runs, so that what they register is there.

A plugin is an importable module that registers members in prorag's registries when imported
(a data format, a process reward, a baseline, ...). :func:`load_plugins` imports, in this
order, every entry point of group ``prorag.plugins`` (installed packages), the modules named
in ``PRORAG_PLUGINS`` (comma-separated), and the modules it is given (the command line's
``--plugin``): from the most general to the most specific, so a later one may override what an
earlier one registered (``register(name, replace=True)``). Importing twice is harmless (Python
keeps imported modules), so the function may be called again. A module that cannot be imported
is a :class:`PluginError` naming where it was asked for. The command line also passes its
``--plugin`` modules on to the processes it starts (:func:`export_plugins`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points

#: The environment variable of comma-separated plugin modules.
ENV_VAR = "PRORAG_PLUGINS"
#: The entry-point group an installed package declares its plugins in (``module`` or ``module:attr``).
ENTRY_POINT_GROUP = "prorag.plugins"


class PluginError(ImportError):
    """A plugin that could not be loaded; the message says which, and where it was named."""


def plugins_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """The module names in ``PRORAG_PLUGINS``, blanks dropped."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return [name.strip() for name in value.split(",") if name.strip()]


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Import the entry points of ``prorag.plugins``, then ``PRORAG_PLUGINS``, then ``modules``.

    Returns the modules loaded, in order, each once. An entry point's value is loaded as
    ``EntryPoint.load`` does (a module, or an attribute of one); its module's import is what
    registers.
    """
    loaded: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            where = f"entry point {ep.name!r} of {ENTRY_POINT_GROUP}"
            raise PluginError(f"plugin {ep.value!r} ({where}) failed to load: {type(e).__name__}: {e}") from e
        if ep.module not in loaded:
            loaded.append(ep.module)
    named = [(name, f"${ENV_VAR}") for name in plugins_from_env()] + [(name, "--plugin") for name in modules]
    for name, origin in named:
        if name in loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:
            raise PluginError(f"plugin {name!r} (from {origin}) failed to load: {type(e).__name__}: {e}") from e
        loaded.append(name)
    return loaded


def export_plugins(modules: Sequence[str]) -> None:
    """Add ``modules`` to ``PRORAG_PLUGINS`` in this process's environment, so that the processes it
    starts (e.g. ablation workers: fresh command lines without ``--plugin``) load them too."""
    named = plugins_from_env()
    added = [m for m in dict.fromkeys(modules) if m not in named]
    if added:
        os.environ[ENV_VAR] = ",".join([*named, *added])


__all__ = ["ENTRY_POINT_GROUP", "ENV_VAR", "PluginError", "export_plugins", "load_plugins", "plugins_from_env"]
