"""The format-aware SFT loss (docs/METHOD.md §2, Eq. 1) and the PPO-clip loss (Eq. 9), as pure tensor functions.

Eq. 1 weighs control-token (tag) log-likelihoods by ``lambda > 1`` and the rest by 1, summed. The
reference code weighs per tag (``<answer>`` pair 5, ``<subquery>``/``<subanswer>`` pairs 3,
``</step>`` 2, others 1) and takes a weighted *mean*; that is the default, since its learning rate
(2e-5) is known to work.

:func:`tag_weight_table` (scheme -> ``{token id: weight}``), :func:`format_token_weights` (0 where
the loss mask is 0: prompt, retrieval, environment tokens, padding), :func:`weighted_lm_loss` (the
weighted next-token NLL; :func:`reduce_weighted_nll` is the reduction alone, for fused heads).
``input_ids``, ``loss_mask`` and ``weights`` are aligned ``(B, T)``; ``logits[:, t]`` predicts
``input_ids[:, t + 1]`` and a target's weight is the one at its own position.
:func:`ppo_clip_loss` is the reference the RL trainer's (TRL's) loss is tested against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from prorag.agent.schema import CONTROL_TAG_WEIGHTS, TAGS
from prorag.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:
    torch = lazy_module("torch")
    F = lazy_module("torch.nn.functional")


WeightScheme = Literal["reference", "paper"]
Reduction = Literal["weighted_mean", "sum"]

#: The weight schemes of :func:`tag_weight_table`.
WEIGHT_SCHEMES: tuple[str, ...] = ("reference", "paper")
#: The reductions of :func:`weighted_lm_loss`.
REDUCTIONS: tuple[str, ...] = ("weighted_mean", "sum")
#: Default ``lambda`` of the paper scheme. The paper only says ``lambda > 1``; 3 is the weight the
#: reference code gives the action tags (``<subquery>``, ``<subanswer>`` and their closers).
DEFAULT_CONTROL_LAMBDA = 3.0


def tag_weight_table(
    tag_ids: Mapping[str, int],
    scheme: WeightScheme = "reference",
    lam: float = DEFAULT_CONTROL_LAMBDA,
    *,
    weights: Mapping[str, float] | None = None,
) -> dict[int, float]:
    """The loss weight of each tag's token id under ``scheme``.

    * ``"reference"``: the reference code's per-tag weights, :data:`~prorag.agent.schema.CONTROL_TAG_WEIGHTS`
      (``<answer>``, ``</answer>`` 5; ``<subquery>``, ``</subquery>``, ``<subanswer>``,
      ``</subanswer>`` 3; ``</step>`` 2; the other tags 1). ``weights`` overrides some of them,
      e.g. ``{"</step>": 3.0}``; ``lam`` is ignored.
    * ``"paper"``: Eq. 1, ``lam`` (which must be > 1) on every one of the ten tags. ``weights``,
      if given, overrides single tags here too.

    ``tag_ids`` maps each of the ten :data:`~prorag.agent.schema.TAGS` to its token id
    (:func:`prorag.models.tags.tag_token_ids`). Tokens absent from the table weigh the ``default`` of
    :func:`format_token_weights` (1). Raises ``ValueError`` for an unknown scheme, a missing tag,
    an unknown tag in ``weights``, a negative weight or ``lam <= 1`` with the paper scheme.
    """
    missing = [t for t in TAGS if t not in tag_ids]
    if missing:
        raise ValueError(f"tag_ids lacks {', '.join(missing)}")
    if scheme == "reference":
        by_tag = dict(CONTROL_TAG_WEIGHTS)
    elif scheme == "paper":
        if not lam > 1:
            raise ValueError(f"the paper scheme needs lambda > 1 (Eq. 1), got {lam}")
        by_tag = {t: float(lam) for t in TAGS}
    else:
        raise ValueError(f"unknown weight scheme {scheme!r}; expected one of {WEIGHT_SCHEMES}")
    for tag, w in (weights or {}).items():
        if tag not in by_tag:
            raise ValueError(f"{tag!r} is not a trajectory tag; expected one of {TAGS}")
        by_tag[tag] = float(w)
    if any(w < 0 for w in by_tag.values()):
        raise ValueError(f"loss weights must be >= 0, got {by_tag}")
    return {int(tag_ids[t]): float(by_tag[t]) for t in TAGS}


def format_token_weights(
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    tag_weights: Mapping[int, float],
    default: float = 1.0,
) -> torch.Tensor:
    """Per-position loss weights ``(B, T)`` (float32): ``tag_weights[id]`` for a tag token,
    ``default`` for any other token, and 0 wherever ``loss_mask`` is 0.

    ``loss_mask`` is 1 on the tokens the model wrote (the targets) and 0 on the prompt,
    environment-written tokens (``<retrieval>`` blocks, separators, ``<step>`` openers after
    the first action) and padding, so none of those is ever a target, whatever its id.
    """
    if input_ids.shape != loss_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and loss_mask {tuple(loss_mask.shape)} differ in shape")
    weights = torch.full(input_ids.shape, float(default), dtype=torch.float32, device=input_ids.device)
    for tid, w in tag_weights.items():
        weights = torch.where(input_ids == int(tid), torch.tensor(float(w), device=input_ids.device), weights)
    return weights * (loss_mask != 0).to(torch.float32)


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Next-token negative log-likelihood ``(B, T - 1)``: entry ``t`` is ``-log p(input_ids[:, t+1])``
    under ``logits[:, t]``, computed in float32."""
    if logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match input_ids {tuple(input_ids.shape)}")
    shifted = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.reshape(-1), reduction="none").view(targets.shape)


def loss_normalizer(weights: torch.Tensor, reduction: Reduction = "weighted_mean") -> torch.Tensor:
    """What :func:`weighted_lm_loss` divides by: the sum of the target weights (``weighted_mean``)
    or the number of target tokens, i.e. of positive weights (``sum``), over positions ``1..T-1``.

    A trainer that accumulates gradients over several micro-batches sums this over all of them
    and passes it as ``normalizer``, so that the accumulated loss equals the loss of one big batch.
    """
    target = weights[:, 1:]
    if reduction == "weighted_mean":
        return target.sum()
    if reduction == "sum":
        return (target > 0).sum().to(target.dtype)
    raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")


def weighted_lm_loss(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    weights: torch.Tensor,
    reduction: Reduction = "weighted_mean",
    *,
    normalizer: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The format-aware next-token loss, a scalar.

    ``logits`` is ``(B, T, V)``, ``input_ids`` and ``weights`` are ``(B, T)``;
    ``logits[:, t]`` predicts ``input_ids[:, t + 1]`` and that target weighs ``weights[:, t + 1]``.
    With ``nll_t = -log p(input_ids[:, t+1])``:

    * ``"weighted_mean"`` (reference code, the default): ``sum(w * nll) / sum(w)``;
    * ``"sum"`` (paper Eq. 1): ``sum(w * nll)`` divided by the number of target tokens
      (positions with ``w > 0``). Eq. 1 is a plain sum, whose size grows with the number of
      tokens in the batch, so the learning rate that suits it would change with batch size and
      trajectory length; dividing by the token count keeps the scale comparable across batches
      while keeping Eq. 1's relative weighting (a control token counts ``lambda`` times as much
      as another token, and heavier tokens are not divided away as the weighted mean does).

    ``normalizer`` replaces the denominator (see :func:`loss_normalizer`: gradient accumulation).
    A batch without any target (all weights 0) gives exactly 0, never NaN; positions with weight
    0 contribute nothing whatever their logits or ids (their NLL is zeroed, not just multiplied,
    so even an infinite NLL there cannot leak in).
    """
    if weights.shape != input_ids.shape:
        raise ValueError(f"weights {tuple(weights.shape)} do not match input_ids {tuple(input_ids.shape)}")
    return reduce_weighted_nll(token_nll(logits, input_ids), weights, reduction, normalizer=normalizer)


def reduce_weighted_nll(
    nll: torch.Tensor,
    weights: torch.Tensor,
    reduction: Reduction = "weighted_mean",
    *,
    normalizer: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The reduction of :func:`weighted_lm_loss` from per-target NLLs already computed.

    ``nll`` is ``(B, T - 1)``, entry ``t`` the NLL of ``input_ids[:, t + 1]`` (as
    :func:`token_nll` gives, or minus the log-probabilities of a fused LM head that never
    builds the full logits); ``weights`` is ``(B, T)``. Positions whose weight is 0 are zeroed
    whatever their NLL.
    """
    if nll.shape != (weights.shape[0], weights.shape[1] - 1):
        raise ValueError(f"nll {tuple(nll.shape)} does not match weights {tuple(weights.shape)} (expected (B, T - 1))")
    w = weights[:, 1:].to(torch.float32)
    nll = nll.to(torch.float32)
    total = torch.where(w > 0, w * nll, torch.zeros_like(nll)).sum()
    if normalizer is None:
        denom = loss_normalizer(weights, reduction).to(total.dtype)
    else:
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")
        denom = torch.as_tensor(normalizer, dtype=total.dtype, device=total.device)
    # No target at all: total is exactly 0 and so is the loss (0 / tiny), with zero gradients.
    return total / denom.clamp(min=torch.finfo(total.dtype).tiny)


# ----------------------------------------------------------------------------- RL: PPO-clip

#: Reductions of :func:`ppo_clip_loss` (and the TRL ``loss_type`` that computes the same one).
PPO_AGGREGATIONS: tuple[str, ...] = ("token_mean", "sequence_mean", "sum")
PPOAggregation = Literal["token_mean", "sequence_mean", "sum"]


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    aggregation: PPOAggregation = "token_mean",
    *,
    normalizer: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The clipped surrogate loss of PPO without a value network (ProRAG Eq. 9), a scalar.

    Per token, with ``rho = exp(logprobs - old_logprobs)``::

        loss_t = -min(rho * A_t, clip(rho, 1 - epsilon_low, 1 + epsilon_high) * A_t)

    (``epsilon_high`` defaults to ``epsilon_low``: symmetric clipping, Eq. 9's single epsilon).
    ``logprobs``, ``old_logprobs`` and ``mask`` are ``(B, T)`` over the completion tokens;
    ``advantages`` is ``(B, T)`` (ProRAG's dual-granularity advantages) or ``(B,)`` (one value per
    trajectory, GRPO). Tokens where ``mask`` is 0 (environment tokens, padding) contribute
    exactly nothing, whatever their advantage or log-probabilities. Reductions:

    * ``"token_mean"`` (default): the sum over masked tokens divided by their number (or by
      ``normalizer``, the token count of a larger batch split into micro-batches; split over P
      data-parallel processes, the global count divided by P, since DDP averages the P
      gradients: TRL's ``dapo`` does exactly this, so P processes get one process's gradient). Every token
      weighs the same, as in Eq. 9's sum over tokens, while the scale does not grow with
      trajectory length (TRL's ``loss_type="dapo"``/``"bnpo"``, verl's ``token-mean``);
    * ``"sequence_mean"``: the mean over rows of each row's token mean (TRL's ``"grpo"``:
      short trajectories weigh more per token);
    * ``"sum"``: Eq. 9 literally up to a constant, ``sum / (B * normalizer)`` with
      ``normalizer`` the maximal completion length (TRL's ``"dr_grpo"``; ``normalizer``
      required).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask {tuple(mask.shape)} differ"
        )
    high = epsilon_low if epsilon_high is None else epsilon_high
    keep = mask != 0
    # Masked positions are neutralised before any arithmetic, so that not even a NaN or an
    # infinite log-probability there can reach the loss or its gradient.
    log_ratio = torch.where(keep, logprobs - old_logprobs, torch.zeros_like(logprobs))
    advantages = torch.where(keep, advantages.to(logprobs.dtype), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    m = keep.to(per_token.dtype)
    tiny = torch.finfo(per_token.dtype).tiny
    if aggregation == "token_mean":
        denom = m.sum() if normalizer is None else torch.as_tensor(normalizer, dtype=per_token.dtype, device=per_token.device)
        return per_token.sum() / denom.clamp(min=tiny)
    if aggregation == "sequence_mean":
        return (per_token.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if aggregation == "sum":
        if normalizer is None:
            raise ValueError("aggregation='sum' needs normalizer (the maximal completion length)")
        return per_token.sum() / (per_token.shape[0] * float(normalizer))
    raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {PPO_AGGREGATIONS}")


__all__ = [
    "DEFAULT_CONTROL_LAMBDA",
    "PPO_AGGREGATIONS",
    "PPOAggregation",
    "REDUCTIONS",
    "WEIGHT_SCHEMES",
    "format_token_weights",
    "loss_normalizer",
    "ppo_clip_loss",
    "reduce_weighted_nll",
    "tag_weight_table",
    "token_nll",
    "weighted_lm_loss",
]
