"""What a generation backend does for the rollout loop: continue token-id sequences.

A backend gets a batch of :class:`Continuation` requests (a context as token ids, a token cap, a
seed) and the :class:`Sampling` settings, and continues each context until it samples one of the
stop ids or reaches its cap. It returns, per request, the ids it sampled (the stop id included,
as the last one), their log-probabilities and whether it stopped on a stop id (``stop``) or the
cap (``length``). Ids in, ids out: nothing is decoded or re-encoded, so the loop
(:mod:`prorag.agent.rollout`) appends them to the trajectory as they are.

Log-probabilities are those of the temperature-scaled distribution (``softmax(logits / T)``;
greedy: ``softmax(logits)``). The ``hf`` backend returns them before top-p filtering; vLLM's
``processed_logprobs`` renormalise over the nucleus, so the two agree when ``top_p`` is 1.
Torch-free: the registry (:data:`prorag.agent.backends.ROLLOUT_BACKENDS`) names backends
without importing them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

#: Why a continuation ended: on a stop id (``stop``) or at its token cap (``length``).
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Sampling:
    """How a backend samples: the rollout config's sampling settings and the ids that end an action."""

    temperature: float
    top_p: float
    greedy: bool
    stop_ids: tuple[int, ...]


@dataclass(frozen=True)
class Continuation:
    """One sequence to continue: its context (prompt, earlier actions, retrieved blocks, as ids),
    at most ``max_tokens`` new tokens, and the seed of its draws (``None``: the backend's own)."""

    ids: tuple[int, ...]
    max_tokens: int
    seed: int | None = None


@dataclass
class Continued:
    """What a backend sampled for one :class:`Continuation`."""

    ids: list[int]
    logprobs: list[float]
    finish: FinishReason


class GenerationBackend(Protocol):
    """A generation backend (see the module docstring)."""

    def continue_batch(self, requests: Sequence[Continuation], sampling: Sampling) -> list[Continued]:
        """Continue every request; results in request order."""
        ...


def finish_of(ids: Sequence[int], stop_ids: Sequence[int]) -> FinishReason:
    """``stop`` when a continuation ends on a stop id, else ``length``: read from the ids, so every
    backend reports it alike (a stop id sampled as the cap's last token counts as a stop, as in vLLM,
    which checks stop ids before the length)."""
    return "stop" if ids and ids[-1] in stop_ids else "length"


__all__ = [
    "Continuation",
    "Continued",
    "FinishReason",
    "GenerationBackend",
    "Sampling",
    "finish_of",
]
