"""Tests and summaries over scores: every p-value, interval and spread the reports print comes from here.

:func:`paired_t_test` compares two systems question by question (:func:`p_value_text` prints its p as a
table shows it), :func:`permutation_test` two sets of runs whose seeds are not paired, and
:func:`mean_and_spread` / :func:`mean_and_ci` summarise a metric over seeds. :func:`holm_adjust` turns the
p-values of a family of contrasts into Holm-Bonferroni adjusted ones, so a report that tests many contrasts
can print the adjusted value beside the nominal one.

Surprising choices: a paired test whose differences are all equal returns the limit (p 1 when they are all
0, p 0 and an infinite t otherwise) instead of scipy's nan; one value has spread 0 but no interval; a NaN
p-value (a contrast that could not be tested) stays NaN under Holm and does not count in the family.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from statistics import fmean, stdev
from typing import TYPE_CHECKING, Any

from prorag.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import numpy as np
    from scipy import stats
else:
    np = lazy_module("numpy")
    stats = lazy_module("scipy.stats")


@dataclass(frozen=True)
class PairedTest:
    """Result of :func:`paired_t_test`.

    ``t`` is the t statistic of the differences ``a - b`` (positive when ``a`` scores higher),
    ``p_value`` the two-sided p-value, ``mean_diff`` the mean of ``a - b``, ``n`` the number
    of pairs (degrees of freedom ``n - 1``).
    """

    t: float
    p_value: float
    mean_diff: float
    n: int


#: Differences whose spread is within this many units of their scale (at least 1) are
#: treated as identical, so that rounding noise in computed scores (2/3 - 1/3 != 1/3 in
#: floating point) does not turn "no variance" into a huge but finite t.
_IDENTICAL_RTOL = 1e-12


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Two-sided paired t-test of per-question scores ``a`` and ``b`` (``scipy.stats.ttest_rel``).

    ``a[i]`` and ``b[i]`` must be the scores of two systems on the same question ``i``.
    Requires equal lengths of at least 2 and finite values (``ValueError`` otherwise).

    Zero variance. When all differences ``a[i] - b[i]`` are identical their standard
    deviation is 0 and t = mean / (sd / sqrt(n)) is 0/0 or x/0; scipy returns nan (or,
    depending on version and rounding, inf or a huge finite number), and nan silently
    poisons any table or comparison it enters. We define the limits explicitly:

    * all differences 0 (the systems agree on every question): no evidence of a
      difference, so ``t = 0.0`` and ``p_value = 1.0``;
    * all differences equal and non-zero (one system is better by the same amount on every
      question): the difference has no noise at all, so ``t = +inf`` or ``-inf`` (the sign
      of the difference) and ``p_value = 0.0``. Read this as "perfectly consistent", and
      look at ``n``: with two or three questions it is still weak evidence.

    Differences are treated as identical when their spread is at most ``1e-12`` times
    ``max(1, max |difference|)``, so floating-point rounding noise does not decide the case.
    """
    a_arr = np.asarray(a, dtype=float)
    b_arr = np.asarray(b, dtype=float)
    if a_arr.ndim != 1 or b_arr.ndim != 1:
        raise ValueError("paired_t_test needs two flat sequences of per-question scores")
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired_t_test needs equal lengths, got {a_arr.size} and {b_arr.size}")
    n = int(a_arr.size)
    if n < 2:
        raise ValueError(f"paired_t_test needs at least 2 pairs, got {n}")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("paired_t_test needs finite scores (found nan or inf)")

    diffs = a_arr - b_arr
    mean_diff = float(np.mean(diffs))
    tolerance = _IDENTICAL_RTOL * max(1.0, float(np.max(np.abs(diffs))))
    if float(np.max(diffs) - np.min(diffs)) <= tolerance:
        if float(np.max(np.abs(diffs))) <= tolerance:
            return PairedTest(t=0.0, p_value=1.0, mean_diff=mean_diff, n=n)
        return PairedTest(t=math.copysign(math.inf, mean_diff), p_value=0.0, mean_diff=mean_diff, n=n)

    result = stats.ttest_rel(a_arr, b_arr)
    return PairedTest(t=float(result.statistic), p_value=float(result.pvalue), mean_diff=mean_diff, n=n)


def p_value_text(test: PairedTest | Mapping[str, Any], digits: int = 3) -> str:
    """A test's p-value as a table or console line shows it: ``"0.044"``.

    Where every difference was the same non-zero amount (``t`` infinite, the limit that
    :func:`paired_t_test` defines as p 0), the count is said beside it: ``"0, all 2 differences equal"``.
    A bare "p=0.000" from two seeds that both gained +0.75 reads as overwhelming evidence;
    it is two numbers that happen to agree. Tests without ``t`` (a permutation test) print
    their p-value alone.
    """
    fields = asdict(test) if isinstance(test, PairedTest) else test
    t, p_value = fields.get("t"), float(fields["p_value"])
    if t is not None and math.isinf(t):
        return f"0, all {fields['n']} differences equal"
    return f"{p_value:.{digits}f}"


def mean_and_spread(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``n - 1`` in the denominator) of ``values``.

    Used to report a metric over seeds as mean +/- std. With a single value the spread is
    reported as 0.0 (the sample std is undefined for n = 1; a single seed shows no spread,
    so say how many seeds a number comes from). Raises ``ValueError`` for no values.
    """
    value_list = [float(v) for v in values]
    if not value_list:
        raise ValueError("mean_and_spread needs at least one value")
    mean = fmean(value_list)
    if len(value_list) == 1:
        return mean, 0.0
    return mean, stdev(value_list)


def mean_and_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided ``level`` confidence interval of the mean, from the
    t distribution with ``n - 1`` degrees of freedom: ``t_{(1+level)/2, n-1} * s / sqrt(n)``.

    For a metric over a handful of seeds: with 5 seeds the t quantile is 2.78, not the normal
    1.96, so the interval is honest about how little 5 numbers say. Needs at least two values
    (``ValueError`` otherwise: one seed has no interval) and ``0 < level < 1``.
    """
    value_list = [float(v) for v in values]
    if len(value_list) < 2:
        raise ValueError(f"mean_and_ci needs at least 2 values (seeds), got {len(value_list)}")
    if not 0 < level < 1:
        raise ValueError(f"mean_and_ci: level must be in (0, 1), got {level}")
    mean, spread = mean_and_spread(value_list)
    n = len(value_list)
    return mean, float(stats.t.ppf((1 + level) / 2, n - 1)) * spread / math.sqrt(n)


@dataclass(frozen=True)
class PermutationTest:
    """Result of :func:`permutation_test`: ``mean_diff`` is ``mean(a) - mean(b)``, ``p_value`` the
    two-sided p-value, ``exact`` whether every split was counted (else ``samples`` random ones)."""

    mean_diff: float
    p_value: float
    n_a: int
    n_b: int
    exact: bool


def permutation_test(
    a: Sequence[float], b: Sequence[float], *, max_exact: int = 250_000, samples: int = 100_000, seed: int = 0
) -> PermutationTest:
    """Two-sided two-sample permutation test of the difference of means of ``a`` and ``b``.

    For two sets of runs that are not paired: RL runs whose float paths part within a few steps share
    a seed in name only, so their per-seed differences carry no pairing, and a handful of runs per set
    is too few to trust a t distribution. Under the null hypothesis the labels are exchangeable, so the
    p-value is the share of the ``C(n_a + n_b, n_a)`` relabellings whose ``|mean difference|`` is at
    least the observed one (ties count, up to 1e-12 of the scale). All relabellings are counted when
    there are at most ``max_exact`` of them; beyond that, ``samples`` random ones (seeded by ``seed``)
    give ``(hits + 1) / (samples + 1)``, which is never 0. Needs at least one finite value per side.
    """
    a_arr = np.asarray(a, dtype=float)
    b_arr = np.asarray(b, dtype=float)
    if a_arr.ndim != 1 or b_arr.ndim != 1 or a_arr.size == 0 or b_arr.size == 0:
        raise ValueError(f"permutation_test needs two non-empty flat sequences, got sizes {a_arr.size} and {b_arr.size}")
    if not (np.all(np.isfinite(a_arr)) and np.all(np.isfinite(b_arr))):
        raise ValueError("permutation_test needs finite values (found nan or inf)")
    pooled = np.concatenate([a_arr, b_arr])
    n_a, n = a_arr.size, pooled.size
    total = float(pooled.sum())
    observed = float(a_arr.mean() - b_arr.mean())
    tolerance = 1e-12 * max(1.0, float(np.abs(pooled).max()))
    exact = math.comb(n, n_a) <= max_exact
    if exact:
        sums = pooled[np.array(list(combinations(range(n), n_a)))].sum(axis=1)
    else:
        rng = np.random.default_rng(seed)
        sums = np.array([pooled[rng.permutation(n)[:n_a]].sum() for _ in range(samples)])
    diffs = sums / n_a - (total - sums) / (n - n_a)
    hits = int(np.count_nonzero(np.abs(diffs) >= abs(observed) - tolerance))
    p_value = hits / diffs.size if exact else (hits + 1) / (samples + 1)
    return PermutationTest(mean_diff=observed, p_value=p_value, n_a=int(n_a), n_b=int(b_arr.size), exact=exact)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of one family of tests, in the order given.

    Sorted ascending, the i-th smallest of m p-values (1-based) becomes ``(m - i + 1) * p``, then the running
    maximum is taken so that the adjusted values keep the order of the nominal ones, and each is capped at 1.
    Rejecting where the adjusted value is below alpha is Holm's step-down procedure: it holds the chance of
    any false positive in the family at alpha under any dependence between the tests, and it never rejects
    less than Bonferroni. ``[0.01, 0.04, 0.03, 0.005]`` gives ``[0.03, 0.06, 0.06, 0.02]``.

    NaN policy: a NaN p-value (a contrast that has no test) is not a member of the family: it stays NaN and
    does not count in m. An empty family gives an empty list; a p-value outside [0, 1] is a ``ValueError``.
    """
    values = [float(p) for p in p_values]
    for p in values:
        if not math.isnan(p) and not 0.0 <= p <= 1.0:
            raise ValueError(f"holm_adjust needs p-values in [0, 1] (or NaN), got {p}")
    tested = sorted((i for i, p in enumerate(values) if not math.isnan(p)), key=lambda i: values[i])
    adjusted = [math.nan] * len(values)
    m = len(tested)
    running = 0.0
    for rank, i in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * values[i]))
        adjusted[i] = running
    return adjusted
