"""Answer and retrieval metrics (docs/METHOD.md §7): every reported number is named after its metric.

:func:`answer_metrics` returns ``em`` (:func:`exact_match`, SQuAD normalisation), ``f1``
(:func:`f1_score`, with HotpotQA's yes/no/noanswer rule), ``cover_em`` (:func:`cover_exact_match`,
R1-Searcher/HiPRAG/CP-Search's "Cover EM" or ACC_R) and ``substring_acc`` (:func:`substring_match`,
FlashRAG's ``acc``); :func:`rouge1_f1` is ROUGE-1 F1 as P2S reports it. The containment metrics
are never EM: a rambling prediction that mentions the gold scores 1 on them and 0 EM.

Every answer metric takes one gold string or a list of aliases and returns the max over aliases.
An empty prediction or alias after normalisation scores 0, even against an empty gold (the official
scripts give EM 1 there): an empty answer is never correct, and containment would credit anything.
:func:`yes_no_scores` (EM on yes/no questions beside a constant guess's), :func:`retrieval_recall`
(gold paragraphs in the first k), :func:`ranking_auc` (a step scorer's valid-over-invalid ranking) and
:func:`grouped_ranking_auc` (the same within groups only) complete the set. Tests over these scores
(paired t-test, permutation test, intervals, Holm) live in :mod:`prorag.core.statistics`.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prorag.core.lazy_modules import lazy_module

if TYPE_CHECKING:
    import numpy as np
    from scipy import stats
else:
    np = lazy_module("numpy")
    stats = lazy_module("scipy.stats")


# Kept importable here for prorag.experiments.pipeline, which is being split in parallel and still imports
# it from this module; import it from prorag.core.statistics.

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
