"""Optional dependencies: a setting that needs one stops with one line naming the extra to install.

The check asks the import system whether the module could be found (``importlib.util.find_spec``)
without importing it: importing vLLM takes seconds and starts CUDA, and a check that runs while a
config is validated must stay cheap and import nothing heavy. A module that is found but broken is
left to fail where it is first imported, with its own error.
"""

from __future__ import annotations

import importlib.util
import sys


class MissingExtraError(ValueError):
    """A setting needs an optional dependency that is not installed (the CLI shows it as one line, exit 2)."""


def has_module(module: str) -> bool:
    """Whether ``module`` (a top-level name such as ``"vllm"``) can be imported, without importing it
    (one imported already counts, also a stand-in a test put in ``sys.modules`` without a spec)."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a stub with no spec
        return False


def require_extra(module: str, extra: str, *, needed_by: str, package: str | None = None) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported.

    ``needed_by`` names the setting that asked for it (``"rollout.backend: vllm"``), ``package``
    the distribution as users know it (default: ``module``), so the line reads
    ``rollout.backend: vllm needs vLLM: pip install 'prorag[vllm]'``.
    """
    if not has_module(module):
        raise MissingExtraError(missing_extra_line(module, extra, needed_by=needed_by, package=package))


def missing_extra_line(module: str, extra: str, *, needed_by: str, package: str | None = None) -> str:
    """The one line :func:`require_extra` says: ``NEEDED_BY needs PACKAGE: pip install 'prorag[EXTRA]'``."""
    return f"{needed_by} needs {package or module}: pip install 'prorag[{extra}]'"
