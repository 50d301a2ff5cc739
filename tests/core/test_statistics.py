"""Tests for prorag.core.statistics: hand-computed p-values, intervals and Holm adjustments, and properties.

Every expected value below is computed by hand; the arithmetic is in the comments or in the test.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prorag.core.statistics import (
    PairedTest,
    holm_adjust,
    mean_and_ci,
    mean_and_spread,
    p_value_text,
    paired_t_test,
    permutation_test,
)

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- paired t-test


def test_paired_t_test_by_hand_df2() -> None:
    a = [1.0, 2.0, 4.0]
    b = [0.0, 1.0, 2.0]
    diffs = [x - y for x, y in zip(a, b)]  # [1, 1, 2]
    n = len(diffs)
    mean = sum(diffs) / n  # 4/3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))  # sqrt((1/9 + 1/9 + 4/9) / 2) = sqrt(1/3)
    t = mean / (sd / math.sqrt(n))  # (4/3) / (1/3) = 4
    assert t == pytest.approx(4.0)
    # Student t with 2 degrees of freedom: P(|T| > t) = 1 - t / sqrt(t^2 + 2).
    p = 1 - t / math.sqrt(t * t + 2)  # 1 - 4 / sqrt(18) = 0.0572
    result = paired_t_test(a, b)
    assert isinstance(result, PairedTest)
    assert result.t == pytest.approx(t)
    assert result.p_value == pytest.approx(p)
    assert result.mean_diff == pytest.approx(4 / 3)
    assert result.n == 3


def test_paired_t_test_by_hand_df3_mixed_signs() -> None:
    a = [0.5, 1.0, 0.0, 1.0]
    b = [0.0, 1.0, 1.0, 0.0]
    # diffs [0.5, 0, -1, 1]: mean 1/8; squared deviations 9/64, 1/64, 81/64, 49/64 -> sum 140/64;
    # var = (140/64) / 3 = 35/48; t = (1/8) / sqrt((35/48) / 4) = (1/8) / sqrt(35/192).
    t = (1 / 8) / math.sqrt(35 / 192)
    # Student t with 3 degrees of freedom: P(|T| > t) = 1 - (2/pi) * (atan(u) + u / (1 + u^2)), u = t / sqrt(3).
    u = t / math.sqrt(3)
    p = 1 - (2 / math.pi) * (math.atan(u) + u / (1 + u * u))
    result = paired_t_test(a, b)
    assert result.t == pytest.approx(t)
    assert result.p_value == pytest.approx(p)
    assert result.mean_diff == pytest.approx(1 / 8)
    assert result.n == 4


def test_paired_t_test_swapped_arguments() -> None:
    forward = paired_t_test([1.0, 2.0, 4.0], [0.0, 1.0, 2.0])
    backward = paired_t_test([0.0, 1.0, 2.0], [1.0, 2.0, 4.0])
    assert backward.t == pytest.approx(-forward.t)
    assert backward.p_value == pytest.approx(forward.p_value)
    assert backward.mean_diff == pytest.approx(-forward.mean_diff)


def test_paired_t_test_all_differences_zero() -> None:
    assert paired_t_test([0.2, 1.0, 0.0], [0.2, 1.0, 0.0]) == PairedTest(t=0.0, p_value=1.0, mean_diff=0.0, n=3)


def test_paired_t_test_all_differences_equal_nonzero() -> None:
    up = paired_t_test([1.0, 1.0, 0.5], [0.5, 0.5, 0.0])
    assert up.t == math.inf and up.p_value == 0.0 and up.mean_diff == pytest.approx(0.5) and up.n == 3
    down = paired_t_test([0.0, 0.0], [1.0, 1.0])
    assert down.t == -math.inf and down.p_value == 0.0 and down.mean_diff == -1.0 and down.n == 2


def test_p_value_text_names_identical_differences() -> None:
    # An ordinary test prints its p-value; two seeds that both gained +0.75 print what p 0 is made of.
    assert p_value_text(paired_t_test([1.0, 0.0, 1.0], [0.0, 0.0, 0.0])) == "0.184"  # t = 2, df 2: 1 - 2/sqrt(6)
    assert p_value_text(paired_t_test([0.3425, 0.3275], [0.3350, 0.3200]), 2) == "0, all 2 differences equal"
    assert p_value_text({"t": 0.0, "p_value": 1.0, "n": 3}) == "1.000"
    # A test without t (the permutation test's dict) prints its p-value alone.
    assert p_value_text({"p_value": 1 / 3, "n": 4}) == "0.333"


def test_paired_t_test_rounding_noise_is_zero_variance() -> None:
    # 0.1 + 0.2 - 0.3 = 5.6e-17 in floating point, mathematically 0: all differences are 0.
    result = paired_t_test([0.1 + 0.2, 0.3, 0.7], [0.3, 0.3, 0.7])
    assert (result.t, result.p_value) == (0.0, 1.0)
    # 2/3 - 1/3 and 1/3 - 0 differ in the last bit; mathematically both are 1/3.
    result = paired_t_test([2 / 3, 1 / 3], [1 / 3, 0.0])
    assert (result.t, result.p_value) == (math.inf, 0.0)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1.0, 0.0], [1.0]),  # unequal lengths
        ([1.0], [0.0]),  # fewer than 2 pairs
        ([], []),
        ([1.0, math.nan], [0.0, 0.0]),
        ([1.0, 0.0], [0.0, math.inf]),
    ],
)
def test_paired_t_test_rejects_bad_input(a, b) -> None:
    with pytest.raises(ValueError):
        paired_t_test(a, b)


def test_paired_test_is_frozen() -> None:
    result = paired_t_test([1.0, 2.0, 4.0], [0.0, 1.0, 2.0])
    with pytest.raises(AttributeError):
        result.t = 0.0  # type: ignore[misc]


# --------------------------------------------------------------------------- mean and spread


def test_mean_and_spread_by_hand() -> None:
    # mean 2.5; squared deviations 2.25, 0.25, 0.25, 2.25 -> 5; sample variance 5/3.
    mean, std = mean_and_spread([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5)
    assert std == pytest.approx(math.sqrt(5 / 3))


def test_mean_and_spread_single_value_and_errors() -> None:
    assert mean_and_spread([0.42]) == (0.42, 0.0)
    assert mean_and_spread(v for v in [0.5, 0.5]) == (0.5, 0.0)
    with pytest.raises(ValueError):
        mean_and_spread([])


# --------------------------------------------------------------------------- properties


_scores = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@PROPERTY_SETTINGS
@given(pairs=st.lists(st.tuples(_scores, _scores), min_size=2, max_size=12))
def test_property_paired_t_test_well_defined(pairs: list[tuple[float, float]]) -> None:
    a = [x for x, _ in pairs]
    b = [y for _, y in pairs]
    forward = paired_t_test(a, b)
    assert not math.isnan(forward.t)
    assert 0.0 <= forward.p_value <= 1.0
    assert forward.n == len(pairs)
    backward = paired_t_test(b, a)
    assert backward.p_value == pytest.approx(forward.p_value)
    if math.isinf(forward.t):
        assert backward.t == -forward.t
    else:
        assert backward.t == pytest.approx(-forward.t)


# --------------------------------------------------------------------------- intervals and unpaired runs


def test_mean_and_ci_by_hand() -> None:
    # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.302653 -> half-width 4.302653 / sqrt(3) = 2.484138.
    mean, half = mean_and_ci([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0) and half == pytest.approx(2.484138, abs=1e-6)
    # 5 seeds at 90%: t_{0.95, 4} = 2.131847; s of [0, 0, 0, 0, 5] = sqrt(5); half = 2.131847 * sqrt(5) / sqrt(5).
    assert mean_and_ci([0, 0, 0, 0, 5], level=0.9)[1] == pytest.approx(2.131847, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        mean_and_ci([1.0])


def test_permutation_test_by_hand() -> None:
    # a = [3, 4], b = [1, 2]: the 6 splits of {1, 2, 3, 4} give mean differences -2, -1, 0, 0, 1, 2;
    # |d| >= 2 in 2 of them -> p = 1/3.
    result = permutation_test([3, 4], [1, 2])
    assert result.mean_diff == pytest.approx(2.0) and result.p_value == pytest.approx(1 / 3) and result.exact
    # [1, 2, 3] against [4, 5, 6]: only the two extreme splits of the 20 reach |d| = 3 -> p = 0.1.
    assert permutation_test([1, 2, 3], [4, 5, 6]).p_value == pytest.approx(0.1)
    # ties count: identical sets give p = 1; unequal sizes, [0] vs [1, 1, 1]: splits put the 0 on a's side
    # (d = -1) or on b's side (d = 1/3), |d| >= 1 in 1 of 4.
    assert permutation_test([2.0, 2.0], [2.0, 2.0]).p_value == 1.0
    assert permutation_test([0], [1, 1, 1]).p_value == pytest.approx(0.25)


def test_permutation_test_sampled_beyond_max_exact() -> None:
    # C(10, 5) = 252 splits; with max_exact below that the p-value is estimated and never 0.
    a, b = [5.0, 6, 7, 8, 9], [0.0, 1, 2, 3, 4]
    exact = permutation_test(a, b)
    assert exact.exact and exact.p_value == pytest.approx(2 / 252)
    sampled = permutation_test(a, b, max_exact=100, samples=20_000, seed=1)
    assert not sampled.exact and 0 < sampled.p_value < 0.02
    assert sampled == permutation_test(a, b, max_exact=100, samples=20_000, seed=1)  # seeded
    with pytest.raises(ValueError, match="non-empty"):
        permutation_test([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        permutation_test([math.nan], [1.0])


# --------------------------------------------------------------------------- Holm


def test_holm_adjust_by_hand() -> None:
    # Sorted: 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04; the running maximum lifts the
    # last to 0.06. Back in the order given: 0.01 -> 0.03, 0.04 -> 0.06, 0.03 -> 0.06, 0.005 -> 0.02.
    assert holm_adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # Two tests: the smaller doubles (0.04), the larger stays (0.3).
    assert holm_adjust([0.3, 0.02]) == pytest.approx([0.3, 0.04])
    assert holm_adjust([0.03]) == [0.03]
    assert holm_adjust([]) == []


def test_holm_adjust_caps_at_one_and_is_monotone() -> None:
    # 0.4 * 3 = 1.2 and 0.6 * 2 = 1.2 are capped at 1; 0.9 * 1 = 0.9 is lifted to the running maximum 1.
    assert holm_adjust([0.9, 0.4, 0.6]) == [1.0, 1.0, 1.0]
    # 0.3 * 2 = 0.6 and 0.5 * 1 = 0.5: the larger nominal p may not get the smaller adjusted one -> both 0.6.
    assert holm_adjust([0.5, 0.3]) == pytest.approx([0.6, 0.6])


def test_holm_adjust_ties_share_a_value() -> None:
    # 0.01 * 3 = 0.03 and 0.01 * 2 = 0.02 lifted to 0.03; 0.04 * 1 = 0.04.
    assert holm_adjust([0.01, 0.04, 0.01]) == pytest.approx([0.03, 0.04, 0.03])


def test_holm_adjust_nan_is_left_out_of_the_family() -> None:
    # Two tested contrasts, not three: 0.01 * 2 = 0.02, 0.02 * 1 = 0.02; the NaN stays NaN where it was.
    adjusted = holm_adjust([0.02, math.nan, 0.01])
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    assert all(math.isnan(p) for p in holm_adjust([math.nan, math.nan]))


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.inf])
def test_holm_adjust_rejects_values_outside_the_unit_interval(bad: float) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        holm_adjust([0.5, bad])


@PROPERTY_SETTINGS
@given(ps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=10), seed=st.integers(0, 1000))
def test_property_holm_between_nominal_and_bonferroni(ps: list[float], seed: int) -> None:
    adjusted = holm_adjust(ps)
    m = len(ps)
    for p, q in zip(ps, adjusted, strict=True):
        assert p <= q <= min(1.0, m * p) + 1e-15
    # Order-preserving: a smaller nominal p never gets a larger adjusted one.
    for i in range(m):
        for j in range(m):
            if ps[i] < ps[j]:
                assert adjusted[i] <= adjusted[j]
    # Reordering the input reorders the output the same way.
    order = list(range(m))
    random.Random(seed).shuffle(order)
    shuffled = holm_adjust([ps[i] for i in order])
    assert shuffled == [adjusted[i] for i in order]
