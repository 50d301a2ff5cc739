"""Pooling a contrast over studies, checked against values computed by hand."""

from __future__ import annotations

import math

import pytest

from research.analysis.meta_analysis import StudyEstimate, fixed_effect, random_effects, study_estimate


def test_study_estimate_is_mean_and_standard_error_of_the_differences() -> None:
    s = study_estimate("a", [1.0, 2.0, 3.0])  # sd 1
    assert (s.name, s.n) == ("a", 3)
    assert s.mean == pytest.approx(2.0)
    assert s.se == pytest.approx(1 / math.sqrt(3))


@pytest.mark.parametrize("values", [[1.0], [], [1.0, math.nan]])
def test_study_estimate_refuses_too_few_or_non_finite(values: list[float]) -> None:
    with pytest.raises(ValueError, match="study 'x'"):
        study_estimate("x", values)


HOMOGENEOUS = [StudyEstimate("a", 1.0, 1.0, 5), StudyEstimate("b", 3.0, 1.0, 5), StudyEstimate("c", 2.0, 2.0, 5)]


def test_fixed_effect_by_hand() -> None:
    # weights 1, 1, 1/4: mean (1 + 3 + 0.5) / 2.25 = 2, se 1 / sqrt(2.25); Q = 1 + 1 + 0 = 2 on 2 df.
    p = fixed_effect(HOMOGENEOUS)
    assert p.method == "fixed" and p.k == 3 and p.tau2 == 0.0
    assert p.mean == pytest.approx(2.0)
    assert p.se == pytest.approx(2 / 3)
    assert p.ci_high - p.mean == pytest.approx(1.959964 * 2 / 3, rel=1e-6)
    assert p.q == pytest.approx(2.0)
    assert p.q_p_value == pytest.approx(math.exp(-1))  # chi-square on 2 df: exp(-Q / 2)
    assert p.i2 == 0.0
    assert p.p_value == pytest.approx(2 * 0.5 * math.erfc(3 / math.sqrt(2)))  # z = 2 / (2/3) = 3


def test_random_effects_without_heterogeneity_keeps_the_weights() -> None:
    # Q equals its degrees of freedom: tau2 0; q* = Q / 2 = 1, so the variance is 1 / 2.25;
    # t on 2 df: P(T > 3) = (1 - 3 / sqrt(11)) / 2, quantile 4.302653.
    p = random_effects(HOMOGENEOUS)
    assert p.method == "random" and p.tau2 == 0.0
    assert p.mean == pytest.approx(2.0)
    assert p.se == pytest.approx(2 / 3)
    assert p.ci_low == pytest.approx(2 - 4.302653 * 2 / 3, rel=1e-6)
    assert p.p_value == pytest.approx(1 - 3 / math.sqrt(11))


def test_random_effects_with_heterogeneity_by_hand() -> None:
    # y 0 and 4, se 1: Q = 8 on 1 df, tau2 = (8 - 1) / (2 - 2/2) = 7, I2 = 7/8; weights 1/8 each,
    # mean 2, q* = (4/8 + 4/8) / 1 = 1, se = sqrt(1 / 0.25) = 2; t on 1 df (Cauchy): p = 0.5.
    p = random_effects([StudyEstimate("a", 0.0, 1.0, 5), StudyEstimate("b", 4.0, 1.0, 5)])
    assert p.tau2 == pytest.approx(7.0)
    assert p.i2 == pytest.approx(7 / 8)
    assert p.mean == pytest.approx(2.0)
    assert p.se == pytest.approx(2.0)
    assert p.p_value == pytest.approx(0.5)
    assert p.ci_high == pytest.approx(2 + 12.706205 * 2, rel=1e-6)
    # The fixed-effect interval ignores the spread between the studies: far narrower.
    assert fixed_effect([StudyEstimate("a", 0.0, 1.0, 5), StudyEstimate("b", 4.0, 1.0, 5)]).se == pytest.approx(math.sqrt(0.5))


def test_hartung_knapp_variance_is_never_below_dersimonian_laird() -> None:
    # Study means closer than their errors say: q* = 0.01, which the modified form raises to 1.
    studies = [StudyEstimate(n, y, 1.0, 5) for n, y in (("a", 1.0), ("b", 1.1), ("c", 0.9))]
    assert random_effects(studies).se == pytest.approx(1 / math.sqrt(3))


def test_pooling_refuses_one_study_a_zero_error_or_a_bad_level() -> None:
    with pytest.raises(ValueError, match="at least 2 studies"):
        random_effects([StudyEstimate("a", 1.0, 1.0, 5)])
    with pytest.raises(ValueError, match="study 'flat'"):
        fixed_effect([StudyEstimate("a", 1.0, 1.0, 5), study_estimate("flat", [2.0, 2.0])])
    with pytest.raises(ValueError, match="level"):
        random_effects(HOMOGENEOUS, level=1.0)
