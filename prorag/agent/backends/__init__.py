"""The generation backends of the rollout loop, by name (``rollout.backend``).

``hf``: the project's own decode loop on a Hugging Face model (static KV cache, CUDA decode
graphs; the CPU default and the tests' engine). ``vllm``: vLLM's offline engine, standalone or the
one TRL owns during RL. Each entry is a :class:`BackendEntry` whose ``build`` imports its module
only when called, so configs and ``--help`` name backends without importing torch or vLLM; a
backend whose package is missing is refused by :func:`check_available` with one line naming the
extra to install, before a stage does any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from prorag.core.extras import has_module, missing_extra_line
from prorag.core.registry import Registry


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: ``build(model, config)`` makes it (``model``: what the caller
    holds, a Hugging Face model or a path, ``config``: the :class:`~prorag.agent.rollout_config.RolloutConfig`),
    ``package`` is the module it needs and ``extra`` prorag's extra that installs it; ``in_process``: whether it
    generates with the Hugging Face model loaded in this process (else it loads the policy's folder
    itself, and a stage loads no weights for it: :func:`~prorag.models.checkpoints.load_sampler`)."""

    build: Callable[[Any, Any], Any]
    package: str | None = None
    extra: str = ""
    in_process: bool = True


#: Generation backends by name (``rollout.backend``).
ROLLOUT_BACKENDS: Registry[BackendEntry] = Registry("rollout backend")


def _build_hf(model: Any, config: Any) -> Any:
    from prorag.agent.backends.hf import HFBackend

    return HFBackend(model, config)


def _build_vllm(model: Any, config: Any) -> Any:
    from prorag.agent.backends.vllm import standalone_backend

    return standalone_backend(model, config)


ROLLOUT_BACKENDS.register(
    "hf", help="the project's decode loop on a Hugging Face model (static KV cache, CUDA decode graphs; the CPU default)"
)(BackendEntry(_build_hf))
ROLLOUT_BACKENDS.register(
    "vllm",
    help="vLLM's offline engine (prefix caching; in RL the engine TRL owns); needs `pip install 'prorag[vllm]'`",
)(BackendEntry(_build_vllm, package="vllm", extra="vllm", in_process=False))


def missing_package(name: str) -> str | None:
    """The one-line reason backend ``name`` cannot run here (its package is not installed, :mod:`prorag.core.extras`),
    else ``None``."""
    entry = ROLLOUT_BACKENDS.get(name)
    if entry.package is None or has_module(entry.package):
        return None
    return missing_extra_line(entry.package, entry.extra, needed_by=f"rollout.backend: {name}")


def check_available(config: Any) -> None:
    """Refuse, with one line, a config (any dataclass, nested ones searched) holding a
    ``RolloutConfig`` whose ``backend`` cannot run here: what a command checks before any work."""
    for found in _rollout_configs(config):
        reason = missing_package(found.backend)
        if reason is not None:
            raise ValueError(reason)


def _rollout_configs(value: Any) -> list[Any]:
    """Every nested dataclass of ``value`` (itself included) that has a ``backend`` and ``max_action_tokens``."""
    if not (is_dataclass(value) and not isinstance(value, type)):
        return []
    own = [value] if hasattr(value, "backend") and hasattr(value, "max_action_tokens") else []
    return own + [c for f in fields(value) for c in _rollout_configs(getattr(value, f.name, None))]


__all__ = [
    "ROLLOUT_BACKENDS",
    "BackendEntry",
    "check_available",
    "missing_package",
]
