"""Stand-in causal LMs for tests: they follow a script instead of learned weights."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from transformers import GenerationConfig


class ReplayLM(torch.nn.Module):
    """A stand-in causal LM that writes given target completions.

    It keeps, as its "cache", the real (unmasked) tokens fed to each row, finds the target
    whose prompt they start with, and puts all mass on the target's next token. If the engine
    feeds anything the target does not contain (a wrong environment insertion, a token at a
    wrong position), the row goes off-script and emits EOS, which the tests detect.
    """

    def __init__(self, targets: dict[tuple[int, ...], list[int]], vocab_size: int, eos_id: int) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.targets = targets
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.generation_config = GenerationConfig(eos_token_id=eos_id)
        self.off_script = 0

    def _next(self, seen: list[int]) -> int:
        for prompt, completion in self.targets.items():
            full = list(prompt) + completion
            if seen[: len(prompt)] == list(prompt):
                if seen != full[: len(seen)]:
                    self.off_script += 1
                    return self.eos_id
                return full[len(seen)] if len(seen) < len(full) else self.eos_id
        self.off_script += 1
        return self.eos_id

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: Any = None, **_: Any) -> Any:
        B, T = input_ids.shape
        seen = past_key_values if past_key_values is not None else [[] for _ in range(B)]
        live = attention_mask[:, -T:]
        logits = torch.full((B, T, self.vocab_size), -30.0)
        for r in range(B):
            seen[r].extend(input_ids[r][live[r] == 1].tolist())
            logits[r, -1, self._next(seen[r])] = 30.0
        return SimpleNamespace(logits=logits, past_key_values=seen)


class CycleLM(ReplayLM):
    """Writes ``next_of[last real token]`` (default ``default``) forever."""

    def __init__(self, next_of: dict[int, int], default: int, vocab_size: int, eos_id: int) -> None:
        super().__init__({}, vocab_size, eos_id)
        self.next_of = next_of
        self.default = default

    def _next(self, seen: list[int]) -> int:
        return self.next_of.get(seen[-1], self.default)
