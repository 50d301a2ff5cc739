"""Pooling one contrast over several studies: inverse-variance meta-analysis of per-seed differences.

A study (one pi_rft and its RL arms, five to seven seeds) enters as the mean and standard error of its
per-seed paired differences, arm minus reference: :func:`study_estimate`. Two poolings:
:func:`fixed_effect` (one true effect shared by every study, inverse-variance weights; right when the
studies repeat one experiment) and :func:`random_effects` (each study its own true effect around a mean,
between-study variance ``tau2`` by DerSimonian and Laird's moments; right here, where studies differ in
world, model and initial policy). The random-effects interval uses Hartung and Knapp's variance with t on
``k - 1`` degrees of freedom, kept no narrower than DerSimonian and Laird's (the "modified" form, Röver
et al. 2015): with a handful of studies the plain normal interval is too narrow. Heterogeneity is Cochran's
``Q`` (chi-square p on ``k - 1`` df) and ``I2``. Caveat: each standard error comes from a few seeds, so
the weights themselves are noisy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats


@dataclass(frozen=True)
class StudyEstimate:
    """One study's estimate of a contrast: ``mean`` and standard error ``se`` over ``n`` seeds."""

    name: str
    mean: float
    se: float
    n: int


@dataclass(frozen=True)
class PooledEstimate:
    """A contrast pooled over ``k`` studies by ``method`` (``fixed`` or ``random``).

    ``ci_low``/``ci_high`` bound the two-sided interval at the level asked for, ``p_value`` is the
    two-sided test of a zero mean (normal for ``fixed``, t on ``k - 1`` degrees of freedom for
    ``random``); ``tau2`` is the between-study variance (0 for ``fixed``), ``q`` Cochran's Q,
    ``q_p_value`` its chi-square p-value and ``i2`` the share of heterogeneity (0 to 1).
    """

    method: str
    mean: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    k: int
    tau2: float
    q: float
    q_p_value: float
    i2: float


def study_estimate(name: str, differences: Sequence[float]) -> StudyEstimate:
    """A study's estimate from its per-seed paired differences: their mean, and the standard error
    ``s / sqrt(n)`` with the sample standard deviation ``s``. Needs at least two finite differences
    (one seed has no spread); all equal gives a standard error of 0, which the poolings refuse."""
    values = [float(d) for d in differences]
    if len(values) < 2:
        raise ValueError(f"study {name!r}: a standard error needs at least 2 per-seed differences, got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"study {name!r}: per-seed differences must be finite, got {values}")
    return StudyEstimate(name, statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values)), len(values))


def _checked(studies: Sequence[StudyEstimate], level: float) -> None:
    if len(studies) < 2:
        raise ValueError(f"pooling needs at least 2 studies, got {len(studies)}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    for s in studies:
        if not (math.isfinite(s.se) and s.se > 0):
            raise ValueError(f"study {s.name!r}: its standard error must be finite and > 0 to weigh it, got {s.se}")


def _heterogeneity(studies: Sequence[StudyEstimate]) -> tuple[float, float, float, float]:
    """Cochran's Q about the fixed-effect mean, its chi-square p-value, I2, and the scale of
    DerSimonian and Laird's ``tau2``: ``sum(w) - sum(w^2) / sum(w)`` of the inverse-variance weights ``w``."""
    weights = [1 / s.se**2 for s in studies]
    total = sum(weights)
    mean = sum(w * s.mean for w, s in zip(weights, studies, strict=True)) / total
    q = sum(w * (s.mean - mean) ** 2 for w, s in zip(weights, studies, strict=True))
    df = len(studies) - 1
    i2 = max(0.0, (q - df) / q) if q > 0 else 0.0
    scale = total - sum(w * w for w in weights) / total
    return q, float(stats.chi2.sf(q, df)), i2, scale


def fixed_effect(studies: Sequence[StudyEstimate], level: float = 0.95) -> PooledEstimate:
    """The inverse-variance weighted mean of the studies' means, with a normal interval."""
    _checked(studies, level)
    weights = [1 / s.se**2 for s in studies]
    total = sum(weights)
    mean = sum(w * s.mean for w, s in zip(weights, studies, strict=True)) / total
    se = math.sqrt(1 / total)
    z = float(stats.norm.ppf((1 + level) / 2))
    q, q_p, i2, _ = _heterogeneity(studies)
    p = float(2 * stats.norm.sf(abs(mean) / se))
    return PooledEstimate("fixed", mean, se, mean - z * se, mean + z * se, p, len(studies), 0.0, q, q_p, i2)


def random_effects(studies: Sequence[StudyEstimate], level: float = 0.95) -> PooledEstimate:
    """The random-effects mean (weights ``1 / (se^2 + tau2)``, DerSimonian-Laird ``tau2``) with the
    modified Hartung-Knapp interval: variance ``max(1, q*) / sum(w*)`` where ``q*`` is the weighted
    spread of the study means about the pooled mean over ``k - 1``, and t quantiles on ``k - 1``
    degrees of freedom (see the module docstring for why)."""
    _checked(studies, level)
    k = len(studies)
    q, q_p, i2, scale = _heterogeneity(studies)
    tau2 = max(0.0, (q - (k - 1)) / scale) if scale > 0 else 0.0
    weights = [1 / (s.se**2 + tau2) for s in studies]
    total = sum(weights)
    mean = sum(w * s.mean for w, s in zip(weights, studies, strict=True)) / total
    spread = sum(w * (s.mean - mean) ** 2 for w, s in zip(weights, studies, strict=True)) / (k - 1)
    se = math.sqrt(max(1.0, spread) / total)
    t = float(stats.t.ppf((1 + level) / 2, k - 1))
    p = float(2 * stats.t.sf(abs(mean) / se, k - 1))
    return PooledEstimate("random", mean, se, mean - t * se, mean + t * se, p, k, tau2, q, q_p, i2)
