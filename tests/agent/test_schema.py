"""Tests for prorag.agent.schema: the trajectory format, its parsers, I_step / I_traj and rendering.

Expected values are written by hand (spans counted on the strings and id lists below); the
property tests check the invariants on random tag soups and random valid trajectories.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prorag.agent.schema import (
    CONTROL_TAG_WEIGHTS,
    STOP_TAGS,
    TAGS,
    Action,
    ActionKind,
    extract_answer,
    i_step,
    i_traj,
    parse_token_actions,
    parse_trajectory,
    render_answer,
    render_conclude,
    render_env_turn,
    render_retrieval,
    render_search,
    render_trajectory,
    step_opener,
)
from prorag.retrieval.base import Hit

S, C, A = ActionKind.SEARCH, ActionKind.CONCLUDE, ActionKind.ANSWER

# No example database: the tests must not write a .hypothesis folder into the repository.
PROPERTY_SETTINGS = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------
# Constants


def test_tags_and_stop_tags() -> None:
    assert TAGS == (
        "<step>", "</step>", "<subquery>", "</subquery>", "<retrieval>",
        "</retrieval>", "<subanswer>", "</subanswer>", "<answer>", "</answer>",
    )  # fmt: skip
    assert STOP_TAGS == ("</subquery>", "</subanswer>", "</answer>")


def test_control_tag_weights_are_the_reference_codes() -> None:
    assert dict(CONTROL_TAG_WEIGHTS) == {
        "<step>": 1, "</step>": 2, "<subquery>": 3, "</subquery>": 3, "<retrieval>": 1,
        "</retrieval>": 1, "<subanswer>": 3, "</subanswer>": 3, "<answer>": 5, "</answer>": 5,
    }  # fmt: skip
    with pytest.raises(TypeError):
        CONTROL_TAG_WEIGHTS["<step>"] = 9  # type: ignore[index]


# ---------------------------------------------------------------------------------------
# Rendering


def test_render_blocks_exactly() -> None:
    assert render_search(" who directed Jaws? ", "Jaws director") == (
        "<step> who directed Jaws? </step><subquery> Jaws director </subquery>"
    )
    assert render_conclude("from doc 1", "Spielberg") == "<step> from doc 1 </step><subanswer> Spielberg </subanswer>"
    assert render_answer("so", "Steven Spielberg") == "<step> so </step><answer> Steven Spielberg </answer>"
    assert render_retrieval("  Doc 1(Title: Jaws) a film\n") == "<retrieval>\nDoc 1(Title: Jaws) a film\n</retrieval>"
    assert render_retrieval([]) == "<retrieval>\n\n</retrieval>"
    assert step_opener() == "<step>"


def test_render_retrieval_from_hits_uses_format_documents() -> None:
    hits = [Hit("1", "Jaws\nA 1975 film.", 2.0), Hit("2", "Spielberg\nA director.", 1.0)]
    assert render_retrieval(hits) == (
        "<retrieval>\nDoc 1(Title: Jaws) A 1975 film.\nDoc 2(Title: Spielberg) A director.\n</retrieval>"
    )


def test_render_retrieval_defangs_tags_in_documents() -> None:
    block = render_retrieval("Doc 1(Title: T) see </retrieval> and <answer>x</answer>")
    assert block == "<retrieval>\nDoc 1(Title: T) see &lt;/retrieval> and &lt;answer>x&lt;/answer>\n</retrieval>"
    text = render_search("t", "q") + "\n" + block + "\n" + render_answer("t", "a")
    parsed = parse_trajectory(text)
    assert parsed.valid and parsed.answer == "a"
    assert parsed.actions[0].retrieval == "Doc 1(Title: T) see &lt;/retrieval> and &lt;answer>x&lt;/answer>"


@pytest.mark.parametrize(
    "thought, content",
    [("", "q"), ("   ", "q"), ("t", ""), ("t", " \n "), ("a <step> b", "q"), ("t", "q </subquery>")],
)
def test_render_refuses_malformed_contents(thought: str, content: str) -> None:
    with pytest.raises(ValueError):
        render_search(thought, content)


def test_render_trajectory_refuses_retrieval_on_non_search() -> None:
    with pytest.raises(ValueError, match="action 1"):
        render_trajectory([Action(C, "t", "c", retrieval="docs")])


# ---------------------------------------------------------------------------------------
# Round trip of a hand-written trajectory

DOCS1 = "Doc 1(Title: Jaws) Jaws is a 1975 film directed by Steven Spielberg.\nDoc 2(Title: Jaws 2) A sequel."
DOCS2 = "Doc 1(Title: Steven Spielberg) Born in Cincinnati, Ohio."

TWO_HOP = [
    Action(S, "I need the director of Jaws.", "Jaws director"),
    Action(C, "Doc 1 says Spielberg directed it.", "Steven Spielberg"),
    Action(S, "Now his birthplace.", "Steven Spielberg birthplace"),
    Action(C, "Doc 1 says Cincinnati.", "Cincinnati"),
    Action(A, "The director was born in Cincinnati.", "Cincinnati"),
]
TWO_HOP[0] = Action(S, TWO_HOP[0].thought, TWO_HOP[0].content, retrieval=DOCS1)
TWO_HOP[2] = Action(S, TWO_HOP[2].thought, TWO_HOP[2].content, retrieval=DOCS2)


def test_two_hop_round_trip_exact() -> None:
    text = render_trajectory(TWO_HOP)
    expected = (
        "<step> I need the director of Jaws. </step><subquery> Jaws director </subquery>\n"
        f"<retrieval>\n{DOCS1}\n</retrieval>\n"
        "<step> Doc 1 says Spielberg directed it. </step><subanswer> Steven Spielberg </subanswer>\n"
        "<step> Now his birthplace. </step><subquery> Steven Spielberg birthplace </subquery>\n"
        f"<retrieval>\n{DOCS2}\n</retrieval>\n"
        "<step> Doc 1 says Cincinnati. </step><subanswer> Cincinnati </subanswer>\n"
        "<step> The director was born in Cincinnati. </step><answer> Cincinnati </answer>"
    )
    assert text == expected
    parsed = parse_trajectory(text)
    assert parsed.valid and parsed.strict_valid and parsed.errors == []
    assert parsed.answer == "Cincinnati"
    assert [(a.kind, a.thought, a.content, a.retrieval, a.well_formed) for a in parsed.actions] == [
        (a.kind, a.thought, a.content, a.retrieval, True) for a in TWO_HOP
    ]
    rendered = [
        render_search(TWO_HOP[0].thought, TWO_HOP[0].content),
        render_conclude(TWO_HOP[1].thought, TWO_HOP[1].content),
        render_search(TWO_HOP[2].thought, TWO_HOP[2].content),
        render_conclude(TWO_HOP[3].thought, TWO_HOP[3].content),
        render_answer(TWO_HOP[4].thought, TWO_HOP[4].content),
    ]
    for action, block in zip(parsed.actions, rendered):
        assert text[action.char_span[0] : action.char_span[1]] == block
        assert action.token_span is None
    # Hand-counted: 6 + 30 + 7 + 10 + 15 + 11 = 79 chars.
    assert parsed.actions[0].char_span == (0, 79)
    assert parsed.actions[-1].char_span[1] == len(text)
    assert i_traj(text) == 1 and i_traj(text, strict=True) == 1
    assert render_trajectory(parsed.actions) == text


def test_non_search_conclude_is_valid_but_not_strict() -> None:
    actions = [
        Action(S, "find the director", "Jaws director", retrieval=DOCS1),
        Action(C, "doc 1", "Steven Spielberg"),
        Action(C, "I know he was born in Cincinnati", "Cincinnati"),  # non-search step
        Action(A, "so", "Cincinnati"),
    ]
    text = render_trajectory(actions)
    parsed = parse_trajectory(text)
    assert [a.kind for a in parsed.actions] == [S, C, C, A]
    assert parsed.actions[2].retrieval is None and parsed.actions[2].content == "Cincinnati"
    assert text[slice(*parsed.actions[2].char_span)] == (
        "<step> I know he was born in Cincinnati </step><subanswer> Cincinnati </subanswer>"
    )
    assert parsed.valid and not parsed.strict_valid
    assert i_traj(text) == 1 and i_traj(text, strict=True) == 0


def test_two_searches_in_a_row_valid_but_not_strict() -> None:
    text = render_trajectory(
        [Action(S, "t", "q1", retrieval="d1"), Action(S, "again", "q2", retrieval="d2"), Action(A, "t", "a")]
    )
    assert i_traj(text) == 1 and i_traj(text, strict=True) == 0


def test_direct_answer_is_strict_valid() -> None:
    assert i_traj("<step> easy </step><answer> 4 </answer>", strict=True) == 1


def test_paper_figure_layout_parses() -> None:
    # Newlines between </step> and the action tag, no spaces inside the tags' contents.
    text = (
        "<step>Which team leads?</step>\n<subquery>Premier League table</subquery>\n"
        "<retrieval>Arsenal is top.</retrieval>\n"
        "<step>Arsenal leads.</step>\n<subanswer>Arsenal</subanswer>\n"
        "<step>They won it.</step>\n<answer>Yes</answer>\n"
    )
    parsed = parse_trajectory(text)
    assert parsed.valid and parsed.strict_valid and parsed.answer == "Yes"
    assert parsed.actions[0].retrieval == "Arsenal is top."
    assert text[slice(*parsed.actions[1].char_span)] == "<step>Arsenal leads.</step>\n<subanswer>Arsenal</subanswer>"


def test_rollout_pieces_concatenate_to_render_trajectory() -> None:
    """Model-written and environment-written pieces, as a rollout engine appends them."""
    opener = len(step_opener())
    pieces = [
        render_search(TWO_HOP[0].thought, TWO_HOP[0].content),  # the first opener: model-written here
        render_env_turn(DOCS1),
        render_conclude(TWO_HOP[1].thought, TWO_HOP[1].content)[opener:],
        render_env_turn(),
        render_search(TWO_HOP[2].thought, TWO_HOP[2].content)[opener:],
        render_env_turn(DOCS2),
        render_conclude(TWO_HOP[3].thought, TWO_HOP[3].content)[opener:],
        render_env_turn(),
        render_answer(TWO_HOP[4].thought, TWO_HOP[4].content)[opener:],
    ]
    assert render_env_turn() == "\n<step>"
    assert "".join(pieces) == render_trajectory(TWO_HOP)


# ---------------------------------------------------------------------------------------
# I_step


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<step> t </step><subquery> q </subquery>", 1),
        ("<step> t </step><subanswer> a </subanswer>", 1),
        ("<step> t </step><answer> a </answer>", 1),
        ("  \n<step> t </step>\n<answer> a </answer>\n", 1),  # whitespace between blocks
        ("<step>  </step><subquery> q </subquery>", 0),  # empty thought
        ("<step> t </step><subquery> \n </subquery>", 0),  # empty subquery
        ("<subquery> q </subquery><step> t </step>", 0),  # wrong order
        ("<step> t </step><subquery> q", 0),  # missing closing tag
        ("<step> t <subquery> x </subquery> </step><subquery> q </subquery>", 0),  # nested tag
        ("<step> t </step><subquery> q <answer> a </subquery>", 0),  # nested tag in content
        ("<step> t </step></step><subquery> q </subquery>", 0),  # stray </step>
        ("<step> t </step><subquery> q </step></subquery>", 0),  # stray </step> inside content
        ("<step> t </step><subquery> q </answer>", 0),  # mismatched closer
        ("<step> t </step> so <answer> a </answer>", 0),  # text between </step> and the tag
        ("<step> t </step><answer> a </answer> and more", 0),  # stray text
        ("<step> t </step><answer> a </answer><step> u </step><answer> b </answer>", 0),  # two actions
        ("<step> t </step><subquery> q </subquery>\n<retrieval>\nd\n</retrieval>", 0),  # not one action
        ("<Step> t </Step><answer> a </answer>", 0),  # look-alike tags are text
        ("", 0),
    ],
)
def test_i_step(text: str, expected: int) -> None:
    assert i_step(text) == expected


def test_malformed_action_errors_are_readable() -> None:
    cases = {
        "<step>  </step><subquery> q </subquery>": "empty <step>",
        "<step> t </step><subquery>  </subquery>": "empty <subquery>",
        "<subquery> q </subquery>": "missing <step>: the action starts with <subquery>",
        "<step> t </step><subquery> q": "unclosed <subquery>",
        "<step> t": "unclosed <step>",
        "<step> t <answer> a </answer>": "<answer> inside <step>",
        "<step> t </step></step><subquery> q </subquery>": (
            "</step> after </step> (expected <subquery>, <subanswer> or <answer>)"
        ),
    }
    for text, message in cases.items():
        parsed = parse_trajectory(text)
        assert parsed.actions[0].errors == (message,), text
        assert f"action 1: {message}" in parsed.errors


# ---------------------------------------------------------------------------------------
# I_traj

GOOD = render_trajectory(TWO_HOP)
SEARCH = render_search("t", "q")
RETR = render_retrieval("Doc 1(Title: T) d")
CONCL = render_conclude("t", "c")
ANS = render_answer("t", "a")


@pytest.mark.parametrize(
    "text, error",
    [
        ("\n".join([SEARCH, RETR, CONCL]), "no <answer> action"),
        ("\n".join([SEARCH, RETR, ANS, ANS]), "more than one <answer> action (actions 2, 3)"),
        ("\n".join([SEARCH, RETR, ANS]) + " Paris", "text after </answer> (at char 121: 'Paris')"),
        ("\n".join([SEARCH, CONCL, ANS]), "search action 1 has no <retrieval> block"),
        ("\n".join([CONCL, RETR, ANS]), "retrieval block 1 has no search action before it (at char 43)"),
        ("\n".join([SEARCH, RETR, "hmm", CONCL, ANS]), "text outside any block (at char 84: 'hmm')"),
        ("\n".join([SEARCH, RETR, "<step> I think the ans"]), "action 2: unclosed <step>"),
        ("\n".join([SEARCH, RETR, ANS, CONCL]), "action 3 comes after the answer (action 2)"),
        ("\n".join([SEARCH, RETR, "</retrieval>", ANS]), "stray </retrieval> (at char 84)"),
        ("\n".join([SEARCH, "<retrieval>\nDoc 1", ANS]), "unclosed <retrieval> (at char 41)"),  # eats the answer
        ("", "no <answer> action"),
    ],
)
def test_i_traj_invalid(text: str, error: str) -> None:
    parsed = parse_trajectory(text)
    assert error in parsed.errors
    assert not parsed.valid and not parsed.strict_valid
    assert i_traj(text) == 0 and i_traj(text, strict=True) == 0


def test_truncated_mid_thought_has_kindless_last_action() -> None:
    text = GOOD[: GOOD.rindex("born in")]
    parsed = parse_trajectory(text)
    assert not parsed.valid and parsed.answer is None
    last = parsed.actions[-1]
    assert last.kind is None and not last.well_formed and last.thought == "The director was"
    # A truncated action runs to the end of the text (here a non-blank segment ending in a space).
    assert last.char_span == (GOOD.rindex("<step>"), len(text))
    assert [a.kind for a in parsed.actions[:-1]] == [S, C, S, C]


def test_answer_of_invalid_trajectory_is_still_read() -> None:
    parsed = parse_trajectory("junk " + ANS)
    assert not parsed.valid and parsed.answer == "a"
    assert parse_trajectory("<step> t </step><answer> Paris").answer is None


@pytest.mark.parametrize(
    "text, expected",
    [
        (GOOD, "Cincinnati"),
        ("blah <answer> Paris </answer> trailing", "Paris"),
        ("<answer> a </answer> then <answer> b </answer>", "b"),
        ("<answer> a <answer>\n b </answer>", "b"),
        ("<answer>  </answer>", ""),
        ("<answer> Paris", None),
        ("Paris </answer>", None),
        ("no tags at all", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


# ---------------------------------------------------------------------------------------
# Token level: a fake vocabulary where the tags are ids 0..9 and words are ids >= 10.

TAG_IDS = {tag: i for i, tag in enumerate(TAGS)}
STEP, STEP_C, SQ, SQ_C, RT, RT_C, SA, SA_C, AN, AN_C = range(10)
NL = 12  # a whitespace token


def _rollout_ids() -> tuple[list[int], list[int]]:
    seq = [
        # (id, env_mask)
        (STEP, 1), (10, 1), (STEP_C, 1), (SQ, 1), (11, 1), (SQ_C, 1),  # 0..5: search
        (NL, 0), (RT, 0), (13, 0), (AN, 0), (14, 0), (RT_C, 0), (NL, 0),  # 6..12: retrieval (an <answer> inside)
        (STEP, 0), (10, 1), (STEP_C, 1), (SA, 1), (15, 1), (SA_C, 1),  # 13..18: conclude, env opener
        (NL, 0), (STEP, 0), (10, 1), (17, 1), (STEP_C, 1), (SA, 1), (16, 1), (SA_C, 1),  # 19..26: non-search conclude
        (NL, 0), (STEP, 0), (10, 1), (STEP_C, 1), (AN, 1), (17, 1), (18, 1), (AN_C, 1),  # 27..34: answer
    ]  # fmt: skip
    return [i for i, _ in seq], [m for _, m in seq]


def test_token_actions_exact_spans() -> None:
    ids, mask = _rollout_ids()
    actions = parse_token_actions(ids, TAG_IDS, mask)
    assert [(a.kind, a.span, a.well_formed, a.env_opener) for a in actions] == [
        (S, (0, 6), True, False),
        (C, (14, 19), True, True),
        (C, (21, 27), True, True),
        (A, (29, 35), True, True),
    ]
    assert [(a.thought_span, a.content_span) for a in actions] == [
        ((1, 2), (4, 5)),
        ((14, 15), (17, 18)),
        ((21, 23), (25, 26)),
        ((29, 30), (32, 34)),
    ]
    for a in actions:
        assert all(mask[k] == 1 for k in range(*a.span))
    # Without a mask the openers belong to the actions.
    assert [a.span for a in parse_token_actions(ids, TAG_IDS)] == [(0, 6), (13, 19), (20, 27), (28, 35)]


def test_token_actions_truncated() -> None:
    ids, mask = _rollout_ids()
    cut = parse_token_actions(ids[:33], TAG_IDS, mask[:33])  # mid-answer
    assert len(cut) == 4
    last = cut[-1]
    assert (last.kind, last.span, last.well_formed, last.errors) == (A, (29, 33), False, ("unclosed <answer>",))
    last = parse_token_actions(ids[:30], TAG_IDS, mask[:30])[-1]  # mid-thought
    assert (last.kind, last.span, last.well_formed, last.errors) == (None, (29, 30), False, ("unclosed <step>",))
    cut = parse_token_actions(ids[:29], TAG_IDS, mask[:29])  # right after the environment's opener
    assert (cut[-1].kind, cut[-1].span, cut[-1].well_formed) == (None, (29, 29), False)
    cut = parse_token_actions(ids[:5], TAG_IDS, mask[:5])  # mid-subquery
    assert [(a.kind, a.span, a.well_formed) for a in cut] == [(S, (0, 5), False)]


def test_token_actions_env_token_inside_action_is_cut_out() -> None:
    ids = [STEP, 10, STEP_C, SQ, 11, 99, 11, SQ_C]
    mask = [1, 1, 1, 1, 1, 0, 1, 1]
    actions = parse_token_actions(ids, TAG_IDS, mask)
    assert (actions[0].span, actions[0].well_formed) == ((0, 5), False)
    assert all(mask[k] for a in actions for k in range(*a.span))


def test_token_blank_ids_between_step_and_action_tag() -> None:
    ids = [STEP, 10, STEP_C, NL, SQ, 11, SQ_C]
    assert parse_token_actions(ids, TAG_IDS, blank_ids={NL})[0].well_formed
    bad = parse_token_actions(ids, TAG_IDS)[0]
    assert not bad.well_formed and bad.errors == ("text between </step> and the action tag",)
    # A thought made only of blank tokens is empty.
    blank_thought = parse_token_actions([STEP, NL, STEP_C, AN, 10, AN_C], TAG_IDS, blank_ids={NL})
    assert blank_thought[0].errors == ("empty <step>",)


def test_truncated_action_span_excludes_trailing_whitespace() -> None:
    parsed = parse_trajectory("<step> t </step>\n  ")
    assert parsed.actions[0].char_span == (0, 16)
    assert parsed.actions[0].errors == ("no action tag after </step>",)
    tokens = parse_token_actions([STEP, 10, STEP_C, NL, NL], TAG_IDS, blank_ids={NL})
    assert (tokens[0].span, tokens[0].errors) == ((0, 3), ("no action tag after </step>",))


def test_token_parser_argument_errors() -> None:
    with pytest.raises(ValueError, match="lacks"):
        parse_token_actions([0], {"<step>": 0})
    with pytest.raises(ValueError, match="distinct"):
        parse_token_actions([0], {**TAG_IDS, "</answer>": 0})
    with pytest.raises(ValueError, match="env_mask"):
        parse_token_actions([0, 1], TAG_IDS, [1])


# ---------------------------------------------------------------------------------------
# Property tests

_TAG_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in TAGS) + ")")


class FakeTokenizer:
    """Tags are ids 0..9; every maximal run of whitespace or of other characters is one word id."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = dict(TAG_IDS)
        self.words: dict[int, str] = {i: t for t, i in TAG_IDS.items()}

    def encode(self, text: str) -> list[int]:
        ids = []
        for part in _TAG_SPLIT.split(text):
            pieces = [part] if part in TAG_IDS else re.findall(r"\s+|\S+", part)
            for piece in pieces:
                if piece not in self.vocab:
                    self.vocab[piece] = len(self.vocab) + 10
                    self.words[self.vocab[piece]] = piece
                ids.append(self.vocab[piece])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)

    @property
    def blank_ids(self) -> set[int]:
        return {i for w, i in self.vocab.items() if i >= 10 and not w.strip()}


WORDS = ["alpha", "beta", "x", "Doc", "1(Title:", "é", "<", ">", "<Step>", "</step", "step>", "&lt;", "a-b"]
words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
spaces = st.sampled_from(["", " ", "\n", "  \n "])
# Words are always separated by whitespace, so that no two of them join into a tag ("</step" + ">").
content = st.tuples(spaces, words, st.sampled_from([" ", "\n"]), st.lists(st.sampled_from(WORDS), max_size=2)).map(
    lambda t: t[0] + t[1] + t[2] + " ".join(t[3])
)


@st.composite
def trajectories(draw: st.DrawFn) -> list[Action]:
    kinds = draw(st.lists(st.sampled_from([S, C]), max_size=5)) + [A]
    out = []
    for kind in kinds:
        thought, text = draw(content).strip(), draw(content).strip()
        retrieval = draw(st.sampled_from(["", "Doc 1(Title: T) d"]) | content.map(str.strip)) if kind is S else None
        out.append(Action(kind, thought, text, retrieval=retrieval))
    return out


soup = st.lists(st.sampled_from(TAGS) | st.sampled_from(WORDS) | spaces, max_size=30).map("".join)


def _check_spans(spans: list[tuple[int, int]], length: int) -> None:
    previous_end = 0
    for start, end in spans:
        assert previous_end <= start <= end <= length
        previous_end = end


@PROPERTY_SETTINGS
@given(trajectories())
def test_property_render_parse_round_trip(actions: list[Action]) -> None:
    text = render_trajectory(actions)
    parsed = parse_trajectory(text)
    assert parsed.valid and parsed.errors == []
    assert [(a.kind, a.thought, a.content, a.retrieval) for a in parsed.actions] == [
        (a.kind, a.thought, a.content, a.retrieval) for a in actions
    ]
    strict = all(a.kind is (S if k % 2 == 0 else C) for k, a in enumerate(actions[:-1])) and len(actions) % 2 == 1
    assert parsed.strict_valid == strict
    assert render_trajectory(parsed.actions) == text


@PROPERTY_SETTINGS
@given(trajectories(), st.data())
def test_property_truncation_is_invalid_and_never_raises(actions: list[Action], data: st.DataObject) -> None:
    text = render_trajectory(actions)
    cut = data.draw(st.integers(0, len(text) - 1))
    parsed = parse_trajectory(text[:cut])
    assert parsed.valid is False and parsed.strict_valid is False and parsed.errors
    assert i_traj(text[:cut]) == 0
    _check_spans([a.char_span for a in parsed.actions], cut)


@PROPERTY_SETTINGS
@given(soup)
def test_property_tag_soup_never_raises(text: str) -> None:
    parsed = parse_trajectory(text)
    assert parsed.valid in (True, False) and parsed.strict_valid in (True, False)
    assert parsed.valid == (parsed.errors == [])
    assert not parsed.strict_valid or parsed.valid
    _check_spans([a.char_span for a in parsed.actions], len(text))
    for a in parsed.actions:
        assert text[a.char_span[0] : a.char_span[1]].startswith(TAGS)  # every action starts at a tag
        assert a.well_formed == (not a.errors)
    assert i_step(text) in (0, 1) and i_traj(text) in (0, 1)
    assert extract_answer(text) is None or isinstance(extract_answer(text), str)


@PROPERTY_SETTINGS
@given(soup)
def test_property_token_parser_agrees_with_text_parser_on_soup(text: str) -> None:
    tok = FakeTokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    by_tokens = parse_token_actions(ids, TAG_IDS, blank_ids=tok.blank_ids)
    by_text = parse_trajectory(text).actions
    assert [(a.kind, a.well_formed, a.errors) for a in by_tokens] == [(a.kind, a.well_formed, a.errors) for a in by_text]
    _check_spans([a.span for a in by_tokens], len(ids))


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(st.integers(0, 14), st.integers(0, 1)), max_size=40))
def test_property_token_soup_with_random_mask(pairs: list[tuple[int, int]]) -> None:
    ids, mask = [i for i, _ in pairs], [m for _, m in pairs]
    actions = parse_token_actions(ids, TAG_IDS, mask, blank_ids={NL})
    _check_spans([a.span for a in actions], len(ids))
    for a in actions:
        assert all(mask[k] == 1 for k in range(*a.span))
        assert all(ids[k] not in (RT, RT_C) for k in range(*a.span))
        assert a.well_formed == (not a.errors)


@PROPERTY_SETTINGS
@given(trajectories(), st.booleans())
def test_property_token_parser_on_rollouts(actions: list[Action], env_first_opener: bool) -> None:
    """Rendered trajectories assembled as a rollout: model pieces (mask 1) and env pieces (mask 0)."""
    tok = FakeTokenizer()
    opener = len(step_opener())
    ids: list[int] = []
    mask: list[int] = []
    model_texts = []

    def add(text: str, m: int) -> None:
        new = tok.encode(text)
        ids.extend(new)
        mask.extend([m] * len(new))

    renderers = {S: render_search, C: render_conclude, A: render_answer}
    for k, action in enumerate(actions):
        block = renderers[action.kind](action.thought, action.content)  # type: ignore[index]
        if k > 0 or env_first_opener:
            add(step_opener(), 0)
            block = block[opener:]
        add(block, 1)
        model_texts.append(block)
        if action.kind is S:
            add("\n" + render_retrieval(action.retrieval or ""), 0)
        if action.kind is not A:
            add("\n", 0)
    assert tok.decode(ids) == render_trajectory(actions)
    by_tokens = parse_token_actions(ids, TAG_IDS, mask, blank_ids=tok.blank_ids)
    by_text = parse_trajectory(render_trajectory(actions))
    assert [a.kind for a in by_tokens] == [a.kind for a in by_text.actions] == [a.kind for a in actions]
    assert all(a.well_formed for a in by_tokens)
    assert [tok.decode(ids[slice(*a.span)]) for a in by_tokens] == model_texts
    assert [a.env_opener for a in by_tokens] == [k > 0 or env_first_opener for k in range(len(actions))]
    for a in by_tokens:
        assert all(mask[k] == 1 for k in range(*a.span))


def test_decode_completion_defangs_only_spelled_tags(world_tokenizer: Any) -> None:
    """Text and token parsers agree on a completion with a spelled-out ``<step>``: both call the
    action malformed; a completion with tag tokens only decodes exactly as the tokenizer does."""
    from prorag.agent.trajectory import decode_completion
    from prorag.models.tags import tag_token_ids

    tok = world_tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    real = enc("<step> I know it </step><answer> Paris </answer>")
    assert decode_completion(tok, real) == tok.decode(real, skip_special_tokens=False)
    spelled = enc("<") + enc("step") + enc(">") + real[1:]
    text = decode_completion(tok, spelled)
    assert text.startswith("&lt;step>") and text.count("<answer>") == 1
    [by_text] = parse_trajectory(text).actions
    [by_ids] = parse_token_actions(spelled, tag_token_ids(tok))
    assert (by_text.kind, by_text.well_formed) == (by_ids.kind, by_ids.well_formed) == (ActionKind.ANSWER, False)
