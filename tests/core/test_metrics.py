"""Tests for prorag.core.metrics: hand-computed golden cases, pitfalls, and properties (the tests of
prorag.core.statistics are in test_statistics.py).

Every expected value below is computed by hand (the arithmetic is in the comments or in the
test), following the official SQuAD v1.1 / HotpotQA evaluation scripts' definitions.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prorag.core.metrics import (
    ANSWER_METRICS,
    answer_metrics,
    cover_exact_match,
    exact_match,
    f1_score,
    grouped_ranking_auc,
    is_yes_no_question,
    normalize_answer,
    ranking_auc,
    retrieval_recall,
    substring_match,
    yes_no_scores,
)

ANSWER_FUNCTIONS = {
    "em": exact_match,
    "f1": f1_score,
    "cover_em": cover_exact_match,
    "substring_acc": substring_match,
}

# No example database: the tests must not write a .hypothesis folder into the repository.
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  An apple   a day\tkeeps\n", "apple day keeps"),
        ("theatre", "theatre"),  # "the" inside a word is kept
        ("Anna", "anna"),  # "an" inside a word is kept
        ("A Theatre", "theatre"),
        ("1,000", "1000"),  # punctuation is deleted, not replaced by a space
        ("3.14", "314"),
        ("U.S.", "us"),
        ("well-known", "wellknown"),
        ("The-End", "theend"),  # punctuation goes first, so "the" is no longer a word
        ("(The) End", "end"),
        ("rock\u2013paper", "rock\u2013paper"),  # an en dash is not in string.punctuation
        ("The", ""),
        ("?!", ""),
        ("", ""),
        ("   ", ""),
    ],
)
def test_normalize_answer_matches_squad_rules(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


# --------------------------------------------------------------------------- EM and F1 golden cases


def test_em_and_f1_after_normalisation() -> None:
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert f1_score("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("1,000", "1000") == 1.0


def test_f1_partial_overlap_by_hand() -> None:
    # [big, red, dog] vs [red, dog, barked]: overlap 2, P = 2/3, R = 2/3, F1 = 2/3.
    assert f1_score("the big red dog", "red dog barked") == pytest.approx(2 / 3)
    assert exact_match("the big red dog", "red dog barked") == 0.0


def test_f1_counts_repeated_tokens_once_per_gold_occurrence() -> None:
    # [red, red, dog] vs [red, dog, barked, loudly]: overlap = min(2,1) + min(1,1) = 2,
    # P = 2/3, R = 2/4, F1 = 2 * (2/3) * (1/2) / (2/3 + 1/2) = (2/3) / (7/6) = 4/7.
    assert f1_score("red red dog", "red dog barked loudly") == pytest.approx(4 / 7)
    # [dog, dog, dog] vs [dog]: overlap 1, P = 1/3, R = 1, F1 = (2/3) / (4/3) = 1/2.
    assert f1_score("dog dog dog", "dog") == pytest.approx(1 / 2)


def test_f1_unequal_lengths_by_hand() -> None:
    # [north, pole] vs [north]: overlap 1, P = 1/2, R = 1, F1 = 1 / (3/2) = 2/3.
    assert f1_score("North Pole", "north") == pytest.approx(2 / 3)


def test_yes_no_rule() -> None:
    assert f1_score("yes", "no") == 0.0
    assert exact_match("yes", "no") == 0.0
    # Tokens overlap ("yes"), which would give P = 1, R = 1/2, F1 = 2/3 without the rule.
    assert f1_score("yes", "yes sir") == 0.0
    assert f1_score("yes sir", "yes") == 0.0  # gold side of the rule
    assert f1_score("no way", "no") == 0.0
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("Yes.", "yes") == 1.0
    assert exact_match("Yes.", "yes") == 1.0


def test_noanswer_rule() -> None:
    # Without the rule: [noanswer, here] vs [noanswer]: P = 1/2, R = 1, F1 = 2/3.
    assert f1_score("noanswer here", "noanswer") == 0.0
    assert f1_score("noanswer", "noanswer here") == 0.0
    assert f1_score("No-Answer", "noanswer") == 1.0  # "No-Answer" normalises to "noanswer"
    assert f1_score("noanswer", "noanswer") == 1.0


def test_yes_no_rule_applies_per_alias() -> None:
    # Alias "yes" gives 0 by the rule, alias "yes sir" gives 1: the max is 1.
    assert f1_score("yes sir", ["yes", "yes sir"]) == 1.0


def test_rule_only_for_whole_answer_not_tokens() -> None:
    # "no" is a token here but the normalised answer is "no idea", not "no": normal F1.
    # [no, idea] vs [idea]: P = 1/2, R = 1, F1 = 2/3.
    assert f1_score("no idea", "idea") == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- aliases and input checks


def test_max_over_aliases() -> None:
    assert exact_match("NYC", ["New York City", "NYC"]) == 1.0
    assert exact_match("NYC", ["New York City", "Big Apple"]) == 0.0
    # Alias 1: [red, dog] vs [red, cat]: F1 1/2. Alias 2: [red, dog] vs [red, dog, runs]:
    # P = 1, R = 2/3, F1 = (4/3) / (5/3) = 4/5. The max is 4/5.
    assert f1_score("red dog", ["red cat", "red dog runs"]) == pytest.approx(4 / 5)
    assert cover_exact_match("big apple pie", ["new york", "big apple"]) == 1.0
    assert substring_match("the big apple", ["new york", "big apple"]) == 1.0


def test_single_string_gold_is_one_alias() -> None:
    # If "new york" were treated as a list of characters, "n" would be a substring alias.
    assert substring_match("nope", "new york") == 0.0
    assert exact_match("new york", "new york") == exact_match("new york", ["new york"]) == 1.0


@pytest.mark.parametrize("name", sorted(ANSWER_FUNCTIONS))
def test_empty_gold_list_raises(name: str) -> None:
    with pytest.raises(ValueError, match="no gold answers"):
        ANSWER_FUNCTIONS[name]("paris", [])
    with pytest.raises(ValueError, match="no gold answers"):
        answer_metrics("paris", ())


@pytest.mark.parametrize("name", sorted(ANSWER_FUNCTIONS))
def test_non_string_gold_or_prediction_raises(name: str) -> None:
    with pytest.raises(TypeError):
        ANSWER_FUNCTIONS[name]("1990", [1990])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        ANSWER_FUNCTIONS[name](None, "paris")  # type: ignore[arg-type]


@pytest.mark.parametrize("prediction", ["", "   ", "\n\t", "the", "An", "?!", "..."])
@pytest.mark.parametrize("golds", ["paris", "", "The", ["", "paris"]])
def test_empty_prediction_scores_zero_everywhere(prediction: str, golds) -> None:
    assert answer_metrics(prediction, golds) == {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "substring_acc": 0.0}
    for name, fn in ANSWER_FUNCTIONS.items():
        assert fn(prediction, golds) == 0.0, name


def test_gold_that_normalises_to_empty_credits_nothing() -> None:
    # An empty gold's token set / string is contained in anything; it must not count.
    assert answer_metrics("anything at all", "The") == {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "substring_acc": 0.0}
    assert cover_exact_match("anything at all", ["?", "anything"]) == 1.0


# --------------------------------------------------------------------------- containment metrics


def test_cover_em_ignores_order_but_substring_does_not() -> None:
    assert cover_exact_match("york is new", "new york") == 1.0
    assert substring_match("york is new", "new york") == 0.0
    assert exact_match("york is new", "new york") == 0.0


def test_substring_counts_partial_words_but_cover_em_does_not() -> None:
    assert substring_match("the smart cat", "art") == 1.0
    assert cover_exact_match("the smart cat", "art") == 0.0
    assert substring_match("1990", "1") == 1.0
    assert cover_exact_match("1990", "1") == 0.0


def test_containment_is_never_em() -> None:
    scores = answer_metrics("President Barack Obama", "Barack Obama")
    # [president, barack, obama] vs [barack, obama]: P = 2/3, R = 1, F1 = (4/3) / (5/3) = 4/5.
    assert scores == {"em": 0.0, "f1": pytest.approx(4 / 5), "cover_em": 1.0, "substring_acc": 1.0}


def test_cover_em_is_set_containment_of_gold_tokens() -> None:
    assert cover_exact_match("new york", "new new york") == 1.0
    assert cover_exact_match("New York, U.S.", "new york") == 1.0
    assert cover_exact_match("new jersey", "new york") == 0.0


def test_answer_metrics_names_and_values() -> None:
    scores = answer_metrics("the big red dog", ["red dog barked", "cat"])
    assert set(scores) == set(ANSWER_METRICS) == {"em", "f1", "cover_em", "substring_acc"}
    # [big, red, dog] vs [red, dog, barked]: F1 = 2/3; "barked" missing -> cover 0;
    # "red dog barked" not in "big red dog" -> substring 0.
    assert scores == {"em": 0.0, "f1": pytest.approx(2 / 3), "cover_em": 0.0, "substring_acc": 0.0}


def test_answer_metrics_takes_max_per_metric_independently() -> None:
    # Alias "red" gives cover 1 and substring 1; alias "red dog barked" gives the best F1
    # ([red, dog] vs [red, dog, barked]: P = 1, R = 2/3, F1 = 4/5; vs [red]: P = 1/2, R = 1, F1 = 2/3).
    scores = answer_metrics("red dog", ["red dog barked", "red"])
    assert scores == {"em": 0.0, "f1": pytest.approx(4 / 5), "cover_em": 1.0, "substring_acc": 1.0}


# --------------------------------------------------------------------------- yes/no questions


def test_yes_no_scores_by_hand() -> None:
    rows = [
        ("No.", ["no"]),  # right: normalises to "no"
        ("no", ["yes"]),  # wrong
        ("Drovi", ["no"]),  # an entity where yes or no was asked
        ("yes", ["Yes"]),  # right
        ("Drovi", ["Drovi"]),  # not a yes/no question: one of the others, right
        ("the Kilen", ["Drovi", "Ostra"]),  # another other, wrong
        ("no", ["Drovi"]),  # "no" where an entity was asked: an other, wrong
    ]
    scores = yes_no_scores(rows)
    # 4 yes/no questions: EM 2/4; 3 answered yes/no, 2 of them "no"; golds 2 "no", 2 "yes": a
    # constant guess scores 2/4.
    # The 3 others: EM 1/3.
    assert scores == {
        "yes_no_n": 4.0,
        "yes_no_em": 0.5,
        "yes_no_answered_rate": 0.75,
        "yes_no_no_rate": pytest.approx(2 / 3),
        "yes_no_constant_em": 0.5,
        "non_yes_no_n": 3.0,
        "non_yes_no_em": pytest.approx(1 / 3),
    }


def test_yes_no_scores_constant_guess_and_absence() -> None:
    # Always "no" on three "no" and one "yes" question: EM equals the constant guess's 0.75.
    rows = [("no", ["no"])] * 3 + [("no", ["yes"])]
    scores = yes_no_scores(rows)
    assert scores is not None
    assert scores["yes_no_em"] == scores["yes_no_constant_em"] == 0.75 and scores["yes_no_no_rate"] == 1.0
    assert "non_yes_no_em" not in scores  # no other question: no EM to report there
    # None answered yes/no; a missing prediction counts as not answered.
    assert yes_no_scores([(None, ["yes"]), ("Kilen", ["no"])]) == {
        "yes_no_n": 2.0,
        "yes_no_em": 0.0,
        "yes_no_answered_rate": 0.0,
        "yes_no_no_rate": 0.0,
        "yes_no_constant_em": 0.5,
    }
    assert yes_no_scores([("Drovi", ["Drovi", "the Drovi"])]) is None
    assert is_yes_no_question(["Yes.", "yes"]) and is_yes_no_question("No") and not is_yes_no_question(["yes", "Drovi"])


# --------------------------------------------------------------------------- retrieval recall


def test_retrieval_recall_cutoff() -> None:
    hits = ["p1", "p2", "p3", "p4"]
    gold = ["p2", "p4"]
    assert retrieval_recall(hits, gold, k=1) == 0.0
    assert retrieval_recall(hits, gold, k=2) == 0.5
    assert retrieval_recall(hits, gold, k=3) == 0.5
    assert retrieval_recall(hits, gold, k=4) == 1.0
    assert retrieval_recall(hits, gold, k=10) == 1.0  # fewer hits than k is fine


def test_retrieval_recall_duplicate_hits_count_once_and_use_ranks() -> None:
    hits = ["p1", "p1", "p2"]
    gold = {"p1", "p2"}
    assert retrieval_recall(hits, gold, k=2) == 0.5  # the duplicate occupies rank 2
    assert retrieval_recall(hits, gold, k=3) == 1.0
    assert retrieval_recall(["p1", "p1", "p1"], ["p1", "p2", "p3"], k=3) == pytest.approx(1 / 3)


def test_retrieval_recall_duplicate_gold_ids_count_once() -> None:
    assert retrieval_recall(["p1"], ["p1", "p1", "p2"], k=1) == 0.5
    assert retrieval_recall(("p1", "x"), (g for g in ["p1", "p2", "p3", "p4"]), k=5) == 0.25


def test_retrieval_recall_no_hits() -> None:
    assert retrieval_recall([], ["p1"], k=5) == 0.0


def test_retrieval_recall_errors() -> None:
    with pytest.raises(ValueError, match="no gold ids"):
        retrieval_recall(["p1"], [], k=1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        retrieval_recall(["p1"], ["p1"], k=0)
    with pytest.raises(TypeError):
        retrieval_recall(["p1"], "p1", k=1)
    with pytest.raises(TypeError):
        retrieval_recall("p1", ["p1"], k=1)


# --------------------------------------------------------------------------- properties

# Words chosen so that random answers collide: articles, yes/no/noanswer, shared tokens,
# a word containing another ("smart" / "art"), punctuation and whitespace.
_WORDS = [
    "the",
    "a",
    "An",
    "yes",
    "no",
    "noanswer",
    "No-Answer",
    "red",
    "dog",
    "new",
    "york",
    "art",
    "smart",
    "1,000",
    "1000",
    "!",
    "",
    " ",
]
answers = st.one_of(
    st.text(max_size=30),
    st.lists(st.sampled_from(_WORDS), max_size=6).map(" ".join),
)
gold_lists = st.lists(answers, min_size=1, max_size=4)


@PROPERTY_SETTINGS
@given(prediction=answers, golds=gold_lists)
def test_property_metrics_in_unit_interval_and_consistent(prediction: str, golds: list[str]) -> None:
    scores = answer_metrics(prediction, golds)
    for name, fn in ANSWER_FUNCTIONS.items():
        assert 0.0 <= scores[name] <= 1.0
        assert fn(prediction, golds) == scores[name]
    assert scores["em"] in (0.0, 1.0)
    assert scores["cover_em"] in (0.0, 1.0)
    assert scores["substring_acc"] in (0.0, 1.0)


@PROPERTY_SETTINGS
@given(prediction=answers, golds=gold_lists)
def test_property_em_implies_every_other_metric(prediction: str, golds: list[str]) -> None:
    scores = answer_metrics(prediction, golds)
    if scores["em"] == 1.0:
        assert scores == {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "substring_acc": 1.0}
    # F1 = 1 means equal token multisets, so every gold token is in the prediction.
    if scores["f1"] == 1.0:
        assert scores["cover_em"] == 1.0


@PROPERTY_SETTINGS
@given(prediction=answers, golds=gold_lists)
def test_property_max_over_aliases(prediction: str, golds: list[str]) -> None:
    for fn in ANSWER_FUNCTIONS.values():
        assert fn(prediction, golds) == max(fn(prediction, g) for g in golds)
        assert fn(prediction, list(reversed(golds))) == fn(prediction, golds)


@PROPERTY_SETTINGS
@given(x=answers)
def test_property_answer_matches_itself(x: str) -> None:
    expected = 1.0 if normalize_answer(x) else 0.0
    assert answer_metrics(x, x) == {"em": expected, "f1": expected, "cover_em": expected, "substring_acc": expected}


@PROPERTY_SETTINGS
@given(x=answers, y=answers)
def test_property_em_and_f1_are_symmetric(x: str, y: str) -> None:
    assert exact_match(x, y) == exact_match(y, x)
    assert f1_score(x, y) == pytest.approx(f1_score(y, x))


@PROPERTY_SETTINGS
@given(x=answers)
def test_property_normalisation_is_idempotent_and_clean(x: str) -> None:
    normalized = normalize_answer(x)
    assert normalize_answer(normalized) == normalized
    assert normalized == normalized.strip()
    assert "  " not in normalized
    assert not set(normalized.split()) & {"a", "an", "the"}


@PROPERTY_SETTINGS
@given(
    hits=st.lists(st.sampled_from(["p1", "p2", "p3", "p4", "p5"]), max_size=8),
    gold=st.lists(st.sampled_from(["p1", "p2", "p3", "p6"]), min_size=1, max_size=4),
    k=st.integers(min_value=1, max_value=10),
)
def test_property_recall_bounded_and_monotone_in_k(hits: list[str], gold: list[str], k: int) -> None:
    recall = retrieval_recall(hits, gold, k)
    assert 0.0 <= recall <= 1.0
    assert retrieval_recall(hits, gold, k + 1) >= recall
    # Hand definition: distinct gold ids among the first k hits over distinct gold ids.
    assert recall == len(set(gold) & set(hits[:k])) / len(set(gold))


# ----------------------------------------------------------------------------- ranking AUC


def test_ranking_auc_hand_computed() -> None:
    # positives {3, 1}, negatives {2, 0}: of the 4 (pos, neg) pairs, 3 > 2, 3 > 0, 1 > 0 win, 1 < 2 loses.
    assert ranking_auc([3.0, 1.0], [2.0, 0.0]) == pytest.approx(3 / 4)
    # a tie counts one half: positives {1, 2} against negative {1}: 0.5 + 1 = 1.5 of 2.
    assert ranking_auc([1.0, 2.0], [1.0]) == pytest.approx(0.75)
    assert ranking_auc([5.0, 6.0], [1.0, 2.0, 3.0]) == 1.0
    assert ranking_auc([1.0], [2.0, 3.0]) == 0.0
    assert ranking_auc([0.5, 0.5], [0.5]) == 0.5


def test_grouped_ranking_auc_counts_only_pairs_inside_a_group() -> None:
    # group a: positives {3, 1} against {2, 0}: 3 of 4 pairs; group b: {10} against {20, 30}: 0 of 2;
    # group c has no negative and drops out. Pooled over the 6 within-group pairs: 3/6. Across
    # groups (ranking_auc of everything) {3, 1, 10} against {2, 0, 20, 30} would be 5/12.
    groups = [([3.0, 1.0], [2.0, 0.0]), ([10.0], [20.0, 30.0]), ([5.0], [])]
    assert grouped_ranking_auc(groups) == pytest.approx(3 / 6)
    assert ranking_auc([3.0, 1.0, 10.0], [2.0, 0.0, 20.0, 30.0]) == pytest.approx(5 / 12)
    assert grouped_ranking_auc([([1.0], [1.0])]) == 0.5  # a tie is one half
    with pytest.raises(ValueError, match="both sides"):
        grouped_ranking_auc([([1.0], []), ([], [2.0])])


def test_ranking_auc_rejects_empty_or_nan() -> None:
    with pytest.raises(ValueError, match="both sides"):
        ranking_auc([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        ranking_auc([float("nan")], [1.0])


@PROPERTY_SETTINGS
@given(pos=st.lists(st.integers(-3, 3), min_size=1, max_size=8), neg=st.lists(st.integers(-3, 3), min_size=1, max_size=8))
def test_property_ranking_auc_is_the_pair_count(pos: list[int], neg: list[int]) -> None:
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    assert ranking_auc(pos, neg) == pytest.approx(wins / (len(pos) * len(neg)))
    assert ranking_auc(neg, pos) == pytest.approx(1 - wins / (len(pos) * len(neg)))


# ----------------------------------------------------------------------------- ROUGE-1 F1 (P2S)


@pytest.mark.parametrize(
    ("prediction", "golds", "expected"),
    [
        # overlap 2 ("red", "dog"); precision 2/4 ("big red dog barked"), recall 2/2: F1 = 2/3
        ("The big red dog barked", "red dog", 2 / 3),
        # no yes/no rule, unlike f1_score: overlap 1, precision 1/1, recall 1/2 -> 2/3
        ("yes", "yes sir", 2 / 3),
        # multiset overlap: "a"-free tokens "paris paris" vs "paris": overlap 1, P 1/2, R 1 -> 2/3
        ("Paris, Paris", "paris", 2 / 3),
        # max over aliases: 0 against "london", 1 against "Paris."
        ("paris", ["london", "Paris."], 1.0),
        ("", "paris", 0.0),
        ("the", "the", 0.0),  # both normalise to empty
    ],
)
def test_rouge1_f1_by_hand(prediction: str, golds: str | list[str], expected: float) -> None:
    from prorag.core.metrics import rouge1_f1

    assert rouge1_f1(prediction, golds) == pytest.approx(expected)


def test_rouge1_f1_differs_from_token_f1_only_on_the_yes_no_rule() -> None:
    from prorag.core.metrics import rouge1_f1

    assert f1_score("yes", "yes sir") == 0.0 and rouge1_f1("yes", "yes sir") == pytest.approx(2 / 3)
    assert rouge1_f1("the big red dog", ["red dog barked", "cat"]) == pytest.approx(
        f1_score("the big red dog", ["red dog barked", "cat"])
    )
    with pytest.raises(ValueError):
        rouge1_f1("paris", ())
