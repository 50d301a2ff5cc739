"""Eq. 4 (docs/METHOD.md §2), its optional pointwise term, and the pairwise metrics of a scorer.

A pair whose two steps score the same counts as half a win, as a tie does in
:func:`~prorag.core.metrics.ranking_auc`.
"""

from __future__ import annotations

import torch
from torch import nn

from prorag.core.metrics import ranking_auc


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``-mean log sigmoid(r+ - r-)`` over pairs (``logsigmoid`` is the stable form)."""
    return -nn.functional.logsigmoid(chosen - rejected).mean()


def prm_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, point_logits: torch.Tensor, point_labels: torch.Tensor, weight: float
) -> torch.Tensor:
    """Eq. 4 on the pairs plus ``weight`` times the binary cross-entropy of the pointwise
    logits against their 0/1 labels (each term a mean over its own items; a term with no item
    in the batch is 0).

    Why the second term: Eq. 4 sees only differences between siblings, so it leaves each
    context's level of the scores free: a PRM can rank every pair right and still give a valid
    step of one question less than an invalid step of another. The RL process advantage compares
    steps across contexts (the group's trajectories and their steps), and the RFT filter reads
    the score's sign, so both need scores that mean the same thing everywhere; the cross-entropy
    ties ``sigmoid(score)`` to the probability that the step is valid. ``weight`` 0 is Eq. 4 alone."""
    zero = (chosen.sum() + point_logits.sum()) * 0.0  # keeps the graph when a term is empty
    loss = pairwise_loss(chosen, rejected) if chosen.numel() else zero
    if weight and point_logits.numel():
        loss = loss + weight * nn.functional.binary_cross_entropy_with_logits(point_logits, point_labels)
    return loss


def pair_wins(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per pair: 1 when the chosen step scores higher, 0.5 on a tie, 0 otherwise (the mean is
    the pairwise accuracy; a tie is a coin flip, as in :func:`~prorag.core.metrics.ranking_auc`)."""
    return (chosen > rejected).float() + 0.5 * (chosen == rejected).float()


def pair_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """Pairwise ``accuracy`` and ``loss`` (Eq. 4) of sibling pairs, mean ``margin``, and the
    ranking ``auc`` of all chosen against all rejected steps (unpaired, across contexts)."""
    return {
        "accuracy": float(pair_wins(chosen, rejected).mean()),
        "loss": float(pairwise_loss(chosen, rejected)),
        "margin": float((chosen - rejected).mean()),
        "auc": ranking_auc(chosen.tolist(), rejected.tolist()),
    }
