"""Text generators: one interface for every model the evaluation can ask for text.

A :class:`TextGenerator` turns a batch of prompts into one :class:`Generation` each, in order;
batching and concurrency live inside it. The served backend (:mod:`prorag.models.served`)
implements it against an OpenAI-compatible server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass
class Generation:
    """One completion: its text and, when asked for, its tokens with their log-probabilities."""

    text: str
    token_logprobs: list[float] | None = None
    tokens: list[str] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"


class TextGenerator(Protocol):
    """Anything that completes prompts: one :class:`Generation` per prompt, in the prompts' order."""

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        logprobs: bool = False,
    ) -> list[Generation]: ...


__all__ = ["Generation", "TextGenerator"]
