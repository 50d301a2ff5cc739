"""An RL run's weight update, ``delta = theta_last - theta_init``: a direction, or a random walk?

- Agreement: :func:`delta_cosine` between two seeds' updates (near 0: mostly the samples' noise), and
  :func:`adam_signal_ratio` of a run's Adam state beside :func:`adam_noise_ratio`, a pure-noise
  gradient's level (Adam spreads noise over every weight at about ``lr * sqrt(steps)``).
- First and second order: with ``EM(theta_init + delta) ~ EM_0 + g.delta + delta'H delta / 2``, the
  mirrored update's EM splits a change (:func:`second_order_split`): half ``EM(+delta) - EM(-delta)``
  is the linear part (learning), their mean minus ``EM_0`` the quadratic part (drift). A permuted
  update (:func:`permuted_delta`: each tensor's entries shuffled) has the same sizes and no direction,
  so it costs the size alone.
- Keeping the first and paying less of the second: a shorter step (``apply_delta`` with ``scale`` below
  1, WiSE-FT's interpolation) and the mean of several runs' updates (:func:`mean_delta`).

Weights are name -> tensor mappings; differences are taken in float32 and integer buffers are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

Weights = Mapping[str, torch.Tensor]


def update_delta(initial: Weights, final: Weights) -> dict[str, torch.Tensor]:
    """``final - initial`` per floating-point tensor, in float32.

    Both must hold the same tensor names and shapes (a LoRA adapter or another architecture is not an
    update of these weights); a mismatch names the first offending tensor. Integer buffers are left out."""
    missing = sorted(set(initial) ^ set(final))
    if missing:
        raise ValueError(f"the two weight sets differ in tensor names (first: {missing[0]!r})")
    out = {}
    for name, start in initial.items():
        end = final[name]
        if start.shape != end.shape:
            raise ValueError(f"tensor {name!r}: shape {tuple(start.shape)} against {tuple(end.shape)}")
        if start.is_floating_point():
            out[name] = end.float() - start.float()
    return out


def delta_rms(delta: Weights) -> float:
    """Root mean square of every entry of ``delta`` (one number for the whole update)."""
    total = sum(float(t.float().pow(2).sum()) for t in delta.values())
    count = sum(t.numel() for t in delta.values())
    if count == 0:
        raise ValueError("delta_rms of an empty update")
    return math.sqrt(total / count)


def delta_cosine(a: Weights, b: Weights) -> float:
    """Cosine between two updates of the same weights, all tensors as one vector (0 when either is 0)."""
    if set(a) != set(b):
        raise ValueError("delta_cosine: the two updates cover different tensors")
    dot = sum(float((a[k].float() * b[k].float()).sum()) for k in a)
    norm_a = math.sqrt(sum(float(t.float().pow(2).sum()) for t in a.values()))
    norm_b = math.sqrt(sum(float(t.float().pow(2).sum()) for t in b.values()))
    return dot / (norm_a * norm_b) if norm_a > 0 and norm_b > 0 else 0.0


def permuted_delta(delta: Weights, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``delta`` with each tensor's entries shuffled among themselves.

    The control keeps every tensor's distribution of step sizes (so its norm, its RMS and its largest
    entries) and removes the direction: which weight moved which way. Shuffling within a tensor rather
    than drawing Gaussian noise keeps the heavy tails and the per-tensor scale Adam gave the update."""
    out = {}
    for name, tensor in delta.items():
        flat = tensor.flatten()
        order = torch.randperm(flat.numel(), generator=generator)
        out[name] = flat[order].reshape(tensor.shape)
    return out


def apply_delta(initial: Weights, delta: Weights, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """``initial + scale * delta`` in each tensor's own dtype (tensors without an update copied)."""
    out = {}
    for name, tensor in initial.items():
        if name in delta:
            out[name] = (tensor.float() + scale * delta[name]).to(tensor.dtype)
        else:
            out[name] = tensor.clone()
    return out


def mean_delta(deltas: Sequence[Weights]) -> dict[str, torch.Tensor]:
    """The average of several updates of the same weights (a "soup" of runs that started from one
    policy: what the runs share adds up, what each run's samples put in alone is divided by their
    number). Every update must cover the same tensors."""
    if not deltas:
        raise ValueError("mean_delta of no updates")
    names = set(deltas[0])
    for i, delta in enumerate(deltas[1:], start=1):
        if set(delta) != names:
            raise ValueError(f"update {i} covers other tensors than update 0")
    return {name: sum(d[name].float() for d in deltas) / len(deltas) for name in deltas[0]}


def second_order_split(base: float, plus: float, minus: float) -> dict[str, float]:
    """The linear and quadratic parts of a score's change along an update (see the module docstring).

    ``plus`` and ``minus`` are the scores at ``theta_init + delta`` and ``theta_init - delta``:
    ``linear = (plus - minus) / 2`` flips with the update's sign, ``quadratic = (plus + minus) / 2 -
    base`` does not, and ``linear + quadratic = plus - base`` (the run's whole change). Exact for a
    score quadratic in the weights; for EM, a reading of which part dominates."""
    return {"change": plus - base, "linear": (plus - minus) / 2, "quadratic": (plus + minus) / 2 - base}


def adam_noise_ratio(beta1: float, step: int) -> float:
    """E|m_hat| / sigma for Adam's bias-corrected first moment when every gradient is independent
    zero-mean Gaussian noise of standard deviation sigma (and v_hat is sigma^2).

    After ``step`` updates, ``m = (1 - beta1) * sum_k beta1^k g_{t-k}`` has variance
    ``sigma^2 (1 - beta1)^2 (1 - beta1^(2 step)) / (1 - beta1^2)``; dividing by the bias correction
    ``(1 - beta1^step)`` and taking E|N(0, s^2)| = s sqrt(2 / pi) gives the value. A run whose state
    shows ``mean(|m_hat| / sqrt(v_hat))`` near this has gradients no more consistent than noise; a
    consistent gradient drives the ratio toward 1."""
    if not 0 <= beta1 < 1 or step < 1:
        raise ValueError(f"adam_noise_ratio needs 0 <= beta1 < 1 and step >= 1, got {beta1}, {step}")
    variance = (1 - beta1) ** 2 * (1 - beta1 ** (2 * step)) / (1 - beta1**2) / (1 - beta1**step) ** 2
    return math.sqrt(2 / math.pi * variance)


def adam_signal_ratio(
    states: Iterable[tuple[torch.Tensor, torch.Tensor]], step: int, betas: tuple[float, float], eps: float = 1e-8
) -> float:
    """Mean over every weight of ``|m_hat| / (sqrt(v_hat) + eps)`` from Adam's state (``exp_avg``,
    ``exp_avg_sq`` per tensor, all at ``step``): the size of an Adam step relative to the learning rate,
    before its sign. Compare with :func:`adam_noise_ratio`."""
    total, count = 0.0, 0
    for exp_avg, exp_avg_sq in states:
        m_hat = exp_avg.float() / (1 - betas[0] ** step)
        v_hat = exp_avg_sq.float() / (1 - betas[1] ** step)
        total += float((m_hat.abs() / (v_hat.sqrt() + eps)).sum())
        count += exp_avg.numel()
    if count == 0:
        raise ValueError("adam_signal_ratio of an empty optimiser state")
    return total / count
