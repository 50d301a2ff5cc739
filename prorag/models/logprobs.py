"""Log-probabilities of chosen tokens without the full logits: the LM head and the log-softmax a chunk
of tokens at a time.

A ``(tokens, vocabulary)`` logits tensor is gigabytes for a batch of long trajectories over a 150k
vocabulary, while scoring needs one number per token. :func:`chunked_logprobs` projects ``chunk``
hidden states at a time, takes each one's ``logit[target] - logsumexp`` in float32 and drops the
chunk's logits; under autograd each chunk is recomputed in the backward (activation checkpointing),
so at most one chunk's logits exist at a time, forward or backward, whatever the batch. The head is
called as a module, so a bias, autocast or a LoRA adapter on it count as in the model's own forward.

TRL's fused LM head (``fused_lm_head=True``) does the same inside the model's forward, at the
sampling temperature it was patched with; :func:`causal_lm_label_logprobs` serves where that does not
fit (another temperature, a model without the patch), through the model's own forward (so wrappers
such as DDP and PEFT see the call) with no logit kept and the last hidden states read back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

#: Tokens per chunk by default: 1024 x a 150k vocabulary is 0.6 GB of float32 logits at a time.
DEFAULT_CHUNK = 1024
#: Config fields of models whose logits are transformed after the LM head (not reproduced here).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def _piece(
    head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor, inv_t: float
) -> torch.Tensor:
    """``log softmax(head(hidden) / T)[targets]`` of one chunk, float32."""
    logits = head(hidden).float()
    if inv_t != 1.0:
        logits = logits * inv_t
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    chunk: int | None = DEFAULT_CHUNK,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``(N,)`` float32: ``log softmax(head(hidden[i]) / temperature)[targets[i]]`` for ``hidden``
    ``(N, H)``, ``chunk`` rows at a time (``None``: all at once, as the direct computation). With
    gradients, each chunk is recomputed in the backward instead of keeping its logits."""
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be >= 1 (or None: one piece), got {chunk}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} differ in length")
    inv_t = 1.0 / float(temperature)
    step = chunk or max(1, hidden.shape[0])
    if hidden.shape[0] <= step or not torch.is_grad_enabled():
        return torch.cat(
            [_piece(head, hidden[s : s + step], targets[s : s + step], inv_t) for s in range(0, hidden.shape[0], step)]
        )
    pieces = [
        checkpoint(
            _piece, head, hidden[s : s + step], targets[s : s + step], inv_t, use_reentrant=False, preserve_rng_state=False
        )
        for s in range(0, hidden.shape[0], step)
    ]
    return torch.cat(pieces)


def _unwrapped(model: Any) -> Any:
    """``model`` without DistributedDataParallel-style wrappers (PEFT forwards attribute look-ups itself)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def check_plain_head(model: Any) -> None:
    """Raise ``ValueError`` when ``model``'s logits are transformed after its LM head (soft-capping,
    scaling), which :func:`causal_lm_label_logprobs` does not reproduce."""
    config = _unwrapped(model).config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [name for name in LOGIT_TRANSFORMS if getattr(text, name, None) is not None]
    if found:
        raise ValueError(f"chunked log-probabilities: {type(config).__name__} transforms its logits ({', '.join(found)})")


def causal_lm_label_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk: int | None = DEFAULT_CHUNK,
    temperature: float = 1.0,
    **forward_kwargs: Any,
) -> torch.Tensor:
    """``(B, T - 1)`` float32: entry ``t`` is ``log p(labels[:, t + 1])`` under the causal LM ``model``
    at ``temperature`` (0 where that label is -100), the layout of TRL's fused LM head. One forward
    keeps no logit (``logits_to_keep`` empty) and returns the last hidden states; only the labelled
    positions go through the LM head, by :func:`chunked_logprobs`. ``forward_kwargs`` go to the model
    (``attention_mask``, ``position_ids``)."""
    check_plain_head(model)
    no_logits = torch.empty(0, dtype=torch.long, device=input_ids.device)
    out = model(input_ids=input_ids, logits_to_keep=no_logits, output_hidden_states=True, use_cache=False, **forward_kwargs)
    hidden = out.hidden_states[-1][:, :-1]
    targets = labels[:, 1:].to(hidden.device)
    keep = targets != -100
    head = _unwrapped(model).get_output_embeddings()
    picked = chunked_logprobs(hidden[keep], head, targets[keep], chunk=chunk, temperature=temperature)
    return torch.zeros(keep.shape, dtype=picked.dtype, device=picked.device).masked_scatter(keep, picked)


__all__ = ["DEFAULT_CHUNK", "LOGIT_TRANSFORMS", "causal_lm_label_logprobs", "check_plain_head", "chunked_logprobs"]
