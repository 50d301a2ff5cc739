"""Answer and retrieval metrics (docs/METHOD.md §7): every reported number is named after its metric.

:func:`answer_metrics` returns ``em`` (:func:`exact_match`, SQuAD normalisation), ``f1``
(:func:`f1_score`, with HotpotQA's yes/no/noanswer rule), ``cover_em`` (:func:`cover_exact_match`,
R1-Searcher/HiPRAG/CP-Search's "Cover EM" or ACC_R) and ``substring_acc`` (:func:`substring_match`,
FlashRAG's ``acc``); :func:`rouge1_f1` is ROUGE-1 F1 as P2S reports it. The containment metrics
are never EM: a rambling prediction that mentions the gold scores 1 on them and 0 EM.

Every answer metric takes one gold string or a list of aliases and returns the max over aliases.
An empty prediction or alias after normalisation scores 0, even against an empty gold (the official
scripts give EM 1 there): an empty answer is never correct, and containment would credit anything.
:func:`yes_no_scores` (EM on yes/no questions beside a constant guess's),
:func:`retrieval_recall` (gold paragraphs in the first k), :func:`paired_t_test` (and :func:`p_value_text`, its p as printed),
:func:`mean_and_spread` and :func:`mean_and_ci` (over seeds), :func:`permutation_test` (two sets of runs whose
seeds are not paired), :func:`ranking_auc` (a step scorer's valid-over-invalid ranking) and
:func:`grouped_ranking_auc` (the same within groups only) complete the set.
"""

from __future__ import annotations

import math
import re
import statistics
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import numpy as np
from scipy import stats

#: Metric name -> what it measures; the keys are those of :func:`answer_metrics`.
ANSWER_METRICS: dict[str, str] = {
    "em": "exact match after SQuAD normalisation, max over gold aliases",
    "f1": "token F1 after SQuAD normalisation (HotpotQA yes/no/noanswer rule), max over gold aliases",
    "cover_em": "every normalised gold token occurs in the normalised prediction (Cover EM / ACC_R); not EM",
    "substring_acc": "normalised gold is a substring of the normalised prediction (FlashRAG acc); not EM",
}

#: Answers for which HotpotQA's F1 gives no partial credit (see :func:`f1_score`).
SPECIAL_ANSWERS: frozenset[str] = frozenset({"yes", "no", "noanswer"})

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Normalise an answer exactly as the official SQuAD v1.1 and HotpotQA scripts do.

    The steps, in this order: lowercase; delete every character of ``string.punctuation``;
    replace the whole words ``a``, ``an``, ``the`` (regex ``\\b(a|an|the)\\b``) with a space;
    collapse runs of whitespace into one space and strip the ends.

    Pitfalls worth knowing (all inherited from the official scripts, on purpose, so that our
    numbers are comparable with published ones):

    * punctuation is *deleted*, not replaced by a space: ``"1,000"`` -> ``"1000"``,
      ``"U.S."`` -> ``"us"``, ``"well-known"`` -> ``"wellknown"``, ``"don't"`` -> ``"dont"``;
    * articles are removed only as whole words: ``"theatre"`` and ``"Anna"`` are kept, and
      since punctuation goes first, ``"The-End"`` becomes the one word ``"theend"`` (kept)
      while ``"(The) End"`` becomes ``"end"``;
    * only ASCII punctuation is removed: curly quotes, dashes such as an en dash, and other
      Unicode punctuation stay in the text and are part of the tokens;
    * an answer made only of articles or punctuation normalises to ``""``.
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _gold_list(golds: str | Sequence[str]) -> list[str]:
    """Return the gold aliases as a list; one string is one alias, not a list of characters."""
    if isinstance(golds, str):
        return [golds]
    gold_list = list(golds)
    if not gold_list:
        raise ValueError("no gold answers given: an answer metric needs at least one gold alias")
    for gold in gold_list:
        if not isinstance(gold, str):
            raise TypeError(f"gold answers must be strings, got {type(gold).__name__}: {gold!r}")
    return gold_list


def _check_prediction(prediction: str) -> None:
    if not isinstance(prediction, str):
        raise TypeError(f"the prediction must be a string, got {type(prediction).__name__}: {prediction!r}")


def _exact_match_normalized(pred: str, gold: str) -> float:
    return float(bool(pred) and pred == gold)


def _f1_normalized(pred: str, gold: str) -> float:
    if not pred or not gold:
        return 0.0
    # HotpotQA: a yes/no/noanswer answer on either side earns no partial token credit.
    if (pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS) and pred != gold:
        return 0.0
    return _unigram_f1(pred, gold)


def _unigram_f1(pred: str, gold: str) -> float:
    """Multiset unigram F1 of two normalised strings (token F1 and ROUGE-1 F1 share it); 0 when
    either is empty (no tokens, no overlap)."""
    pred_tokens = pred.split()
    gold_tokens = gold.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _cover_normalized(pred: str, gold: str) -> float:
    if not pred or not gold:
        return 0.0
    return float(set(gold.split()) <= set(pred.split()))


def _substring_normalized(pred: str, gold: str) -> float:
    if not pred or not gold:
        return 0.0
    return float(gold in pred)


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """Exact match: 1.0 if the normalised prediction equals a normalised gold alias, else 0.0.

    ``golds`` is one gold string or a sequence of aliases (max over aliases). An empty
    normalised prediction or alias never matches (see the module docstring). Raises
    ``ValueError`` for an empty alias list.
    """
    _check_prediction(prediction)
    pred = normalize_answer(prediction)
    return max(_exact_match_normalized(pred, normalize_answer(g)) for g in _gold_list(golds))


def f1_score(prediction: str, golds: str | Sequence[str]) -> float:
    """Token F1 between the normalised prediction and the best gold alias, in [0, 1].

    Tokens are the whitespace-separated words of the normalised strings; overlap counts
    repeated tokens at most as often as they occur on both sides (multiset intersection),
    precision = overlap / prediction tokens, recall = overlap / gold tokens.

    HotpotQA rule: if the normalised prediction is ``yes``, ``no`` or ``noanswer`` and
    differs from the normalised gold, or the normalised gold is one of them and differs
    from the prediction, the score is 0. So ``"yes"`` against ``"yes sir"`` scores 0 even
    though the tokens overlap: a yes/no answer is either right or wrong.

    An empty normalised prediction (``""``, whitespace, only punctuation or articles)
    scores 0. Raises ``ValueError`` for an empty alias list.
    """
    _check_prediction(prediction)
    pred = normalize_answer(prediction)
    return max(_f1_normalized(pred, normalize_answer(g)) for g in _gold_list(golds))


def cover_exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """Cover EM / ACC_R (R1-Searcher, HiPRAG, CP-Search): token containment, 1.0 or 0.0.

    1.0 if every token of a normalised gold alias occurs among the tokens of the normalised
    prediction, in any order and anywhere (set containment: repeated gold tokens need to
    occur only once). Tokens are whole words, so gold ``"art"`` is *not* covered by
    ``"smart"``; but word order is ignored, so gold ``"new york"`` *is* covered by
    ``"york is new"``. This is a containment metric, not exact match: never report it as EM.
    """
    _check_prediction(prediction)
    pred = normalize_answer(prediction)
    return max(_cover_normalized(pred, normalize_answer(g)) for g in _gold_list(golds))


def substring_match(prediction: str, golds: str | Sequence[str]) -> float:
    """FlashRAG ``acc``: 1.0 if a normalised gold alias is a substring of the normalised prediction.

    Pitfall: this is character-level containment, so it credits partial words: gold
    ``"art"`` matches the prediction ``"the smart cat"``, and a short gold such as ``"1"``
    matches ``"1990"``. It does respect word order (gold ``"new york"`` does not match
    ``"york is new"``). A containment metric, not exact match: never report it as EM.
    """
    _check_prediction(prediction)
    pred = normalize_answer(prediction)
    return max(_substring_normalized(pred, normalize_answer(g)) for g in _gold_list(golds))


def rouge1_f1(prediction: str, golds: str | Sequence[str]) -> float:
    """ROUGE-1 F1 (P2S's ``ROUGE-1``): unigram-overlap F1 between the normalised prediction and
    the best gold alias, in [0, 1].

    Unigrams are the whitespace tokens of :func:`normalize_answer` (SQuAD normalisation, no
    stemming or stop-word removal, so the number sits beside EM and F1 on the same tokens);
    overlap is the multiset intersection. Unlike :func:`f1_score` there is no yes/no rule:
    ``"yes"`` against ``"yes sir"`` earns partial credit (2/3), as ROUGE gives it. An empty
    normalised prediction or alias scores 0; ``ValueError`` for an empty alias list.
    """
    _check_prediction(prediction)
    pred = normalize_answer(prediction)
    return max(_unigram_f1(pred, normalize_answer(g)) for g in _gold_list(golds))


def answer_metrics(prediction: str, golds: str | Sequence[str]) -> dict[str, float]:
    """All four answer metrics, keyed by metric name (see :data:`ANSWER_METRICS`).

    Returns ``{"em", "f1", "cover_em", "substring_acc"}``; each is the max over gold
    aliases on its own (the aliases that maximise two metrics may differ).
    """
    _check_prediction(prediction)
    gold_list = _gold_list(golds)
    pred = normalize_answer(prediction)
    normalized_golds = [normalize_answer(g) for g in gold_list]
    return {
        "em": max(_exact_match_normalized(pred, g) for g in normalized_golds),
        "f1": max(_f1_normalized(pred, g) for g in normalized_golds),
        "cover_em": max(_cover_normalized(pred, g) for g in normalized_golds),
        "substring_acc": max(_substring_normalized(pred, g) for g in normalized_golds),
    }


#: The answers of a question two words can answer, normalised.
YES_NO: frozenset[str] = frozenset({"yes", "no"})


def _yes_no_golds(golds: str | Sequence[str]) -> set[str] | None:
    """The normalised gold aliases of a yes/no question (every alias ``yes`` or ``no``), else None."""
    normalized = {normalize_answer(g) for g in _gold_list(golds)}
    return normalized if normalized <= YES_NO else None


def is_yes_no_question(golds: str | Sequence[str]) -> bool:
    """Whether every gold alias normalises to ``yes`` or ``no`` (a question two words can answer)."""
    return _yes_no_golds(golds) is not None


def yes_no_scores(rows: Iterable[tuple[str | None, Sequence[str]]]) -> dict[str, float] | None:
    """EM on the yes/no questions beside what a constant guess scores there.

    ``rows`` are ``(prediction, gold aliases)``; the yes/no questions are those of
    :func:`is_yes_no_question`. A policy can raise EM on such questions without reading a
    single document, by answering one of the two words more often: a gain in EM is a gain in
    reasoning only where it rises above the better constant guess. Returns ``None`` without
    yes/no questions, else ``yes_no_n`` (their count), ``yes_no_em``, ``yes_no_answered_rate``
    (the share of predictions that are yes or no at all), ``yes_no_no_rate`` (the share of ``no``
    among those; 0 when none is) and ``yes_no_constant_em`` (the EM of always answering the gold
    majority word: the share of its questions), and beside them ``non_yes_no_n`` and
    ``non_yes_no_em``: the EM of the other questions (left out when there are none), where the
    answer has to be found, so that a gain there is not a gain in the answer's form.
    """
    binary = []
    others = []
    for pred, golds in rows:
        normalized = _yes_no_golds(golds)
        if normalized is not None:
            binary.append((normalize_answer(pred or ""), normalized))
        else:
            others.append(exact_match(pred or "", golds))
    if not binary:
        return None
    n = len(binary)
    answered = [pred for pred, _ in binary if pred in YES_NO]
    no_share = sum("no" in golds for _, golds in binary) / n
    return {
        "yes_no_n": float(n),
        "yes_no_em": sum(pred in golds for pred, golds in binary) / n,
        "yes_no_answered_rate": len(answered) / n,
        "yes_no_no_rate": answered.count("no") / len(answered) if answered else 0.0,
        "yes_no_constant_em": max(no_share, sum("yes" in golds for _, golds in binary) / n),
    } | ({"non_yes_no_n": float(len(others)), "non_yes_no_em": sum(others) / len(others)} if others else {})


def retrieval_recall(hit_ids: Sequence[str], gold_ids: Iterable[str], k: int) -> float:
    """Recall at k: the fraction of the distinct gold ids found among the first ``k`` hit ids.

    Gold ids are deduplicated, and a gold id retrieved twice counts once, so the value is
    in [0, 1]. Fewer than ``k`` hits is fine (all of them count). Note that duplicates in
    ``hit_ids`` still occupy ranks: the first ``k`` entries are taken as given, not the
    first ``k`` distinct ids.

    Raises ``ValueError`` if ``gold_ids`` is empty (recall is undefined: a question without
    gold evidence must be left out of the retrieval average, not scored 0 or 1) or if
    ``k < 1``; ``TypeError`` if either argument is a single string (which would otherwise
    be read as a sequence of one-character ids).
    """
    if isinstance(hit_ids, str) or isinstance(gold_ids, str):
        raise TypeError("hit_ids and gold_ids must be collections of ids, not a single string")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}: {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    gold = set(gold_ids)
    if not gold:
        raise ValueError("no gold ids given: retrieval recall is undefined without gold supporting paragraphs")
    found = gold.intersection(hit_ids[:k])
    return len(found) / len(gold)


def ranking_auc(positive_scores: Sequence[float], negative_scores: Sequence[float]) -> float:
    """Area under the ROC curve of scores that should rank ``positive`` items above ``negative``
    ones: the probability that a random positive outscores a random negative, ties counting
    one half (the Mann-Whitney U statistic divided by ``n_pos * n_neg``).

    Used for a process reward model on the valid (positive) and invalid (negative) steps of
    sampled trajectories: 1.0 ranks every valid step above every invalid one, 0.5 is chance.
    Unlike pairwise accuracy it compares steps across contexts, not siblings of one parent.
    Computed from the average ranks of the pooled scores (``O(n log n)``, ties exact).
    Requires at least one score on each side and finite values (``ValueError`` otherwise).
    """
    pos = np.asarray(positive_scores, dtype=float)
    neg = np.asarray(negative_scores, dtype=float)
    if pos.ndim != 1 or neg.ndim != 1:
        raise ValueError("ranking_auc needs two flat sequences of scores")
    if pos.size == 0 or neg.size == 0:
        raise ValueError(f"ranking_auc needs scores on both sides, got {pos.size} positive and {neg.size} negative")
    if not (np.all(np.isfinite(pos)) and np.all(np.isfinite(neg))):
        raise ValueError("ranking_auc needs finite scores (found nan or inf)")
    ranks = stats.rankdata(np.concatenate([pos, neg]))  # average ranks: a tie shares its ranks
    u = float(ranks[: pos.size].sum()) - pos.size * (pos.size + 1) / 2.0
    return u / (pos.size * neg.size)


def grouped_ranking_auc(groups: Iterable[tuple[Sequence[float], Sequence[float]]]) -> float:
    """:func:`ranking_auc` over the (positive, negative) pairs that share a group only: each group
    is ``(positive_scores, negative_scores)``, and the result is the share of within-group pairs
    the scores order right (ties one half), pooled over groups (each group weighs by its number
    of pairs, ``n_pos * n_neg``). Groups with no score on one side have no pair and drop out.

    Why it exists beside the global AUC: a step reward enters the advantage only through
    comparisons inside one question's group of samples (:mod:`prorag.method.advantages`), so a
    scorer that ranks steps well across questions (say, by how hard the question is) but not
    within one tells the policy nothing. This is the ranking the advantage sees. Raises
    ``ValueError`` when no group has a pair."""
    wins = 0.0
    pairs = 0
    for positive, negative in groups:
        if len(positive) and len(negative):
            n = len(positive) * len(negative)
            wins += ranking_auc(positive, negative) * n
            pairs += n
    if pairs == 0:
        raise ValueError("grouped_ranking_auc needs a group with scores on both sides")
    return wins / pairs


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
    mean = statistics.fmean(value_list)
    if len(value_list) == 1:
        return mean, 0.0
    return mean, statistics.stdev(value_list)


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
