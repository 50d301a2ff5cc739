"""The step judges: the oracle's validity rules on hand-made histories (world and MuSiQue
decompositions), the pair choice, and the LLM judge's strict JSON replies, retries and cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prorag.data.records import Record
from prorag.supervision.judge import (
    Candidate,
    Judgement,
    JudgeRequest,
    LLMJudge,
    OracleJudge,
    StepView,
    choose_pair,
    hop_subject,
    judge_messages,
    oracle_hops,
    parse_judgement,
    step_verdict,
    targets,
)
from prorag.supervision.llm_teacher import LLMTeacherConfig
from tests.fake_chat_server import FakeChatServer, Reply, user_text

#: A chain question of the built-in world: director of Saenax -> Siril, born in -> Tamal, country -> Krirek.
CHAIN = Record(
    "w4-q1",
    "Which country is the birthplace of the director of Saenax in?",
    ["Krirek"],
    {
        "partition": "w4",
        "decomposition": [
            {"question": "Who directed Saenax?", "answer": "Siril", "query": "Saenax director", "subject": "Saenax"},
            {"question": "Where was Siril born?", "answer": "Tamal", "query": "Siril born", "subject": "Siril"},
            {"question": "Which country is Tamal in?", "answer": "Krirek", "query": "Tamal country", "subject": "Tamal"},
        ],
    },
)
#: A comparison: the two sides are independent, the third hop needs the second.
COMPARE = Record(
    "w4-q0",
    "Are Tamal and the home city of Brisak in the same country?",
    ["no"],
    {
        "decomposition": [
            {"question": "Which country is Tamal in?", "answer": "Krirek", "query": "Tamal country", "subject": "Tamal"},
            {"question": "Where is Brisak based?", "answer": "Tamol", "query": "Brisak based in", "subject": "Brisak"},
            {"question": "Which country is Tamol in?", "answer": "Verol", "query": "Tamol country", "subject": "Tamol"},
        ]
    },
)
#: MuSiQue's notation: "Entity >> relation", "#1" references, resolved questions.
MUSIQUE = Record(
    "2hop_1",
    "What is the seat of the county where Van Hook Township is located?",
    ["Stanley"],
    {
        "decomposition": [
            {"question": "Van Hook Township >> located in the administrative territorial entity", "answer": "Mountrail County"},
            {"question": "#1 >> capital", "answer": "Stanley", "question_resolved": "Mountrail County >> capital"},
        ]
    },
)


def search(query: str, docs: str = "") -> StepView:
    return StepView("search", query, True, f"<step> t </step><subquery> {query} </subquery>", docs)


def conclude(answer: str) -> StepView:
    return StepView("conclude", answer, True, f"<step> t </step><subanswer> {answer} </subanswer>")


def answer(text: str) -> StepView:
    return StepView("answer", text, True, f"<step> t </step><answer> {text} </answer>")


SAENAX_DOCS = "<retrieval>\nDoc 1(Title: Saenax) Saenax is a film. Saenax was directed by Siril.\n</retrieval>"
SIRIL_DOCS = "<retrieval>\nDoc 1(Title: Siril) Siril was born in Tamal.\n</retrieval>"
TAMAL_DOCS = "<retrieval>\nDoc 1(Title: Tamal) Tamal is a city in Krirek.\n</retrieval>"
#: The whole chain worked out: three searches, three supported conclusions.
RESOLVED_ALL = [
    search("Saenax director", SAENAX_DOCS),
    conclude("Siril"),
    search("Siril born", SIRIL_DOCS),
    conclude("Tamal"),
    search("Tamal country", TAMAL_DOCS),
    conclude("Krirek"),
]


def test_subjects_and_dependencies_of_gold_hops() -> None:
    chain = oracle_hops(CHAIN)
    assert [h.subject for h in chain] == ["Saenax", "Siril", "Tamal"]
    assert [h.depends_on for h in chain] == [frozenset(), {0}, {1}]
    compare = oracle_hops(COMPARE)
    assert [h.depends_on for h in compare] == [frozenset(), frozenset(), {1}]
    mus = oracle_hops(MUSIQUE)
    assert [h.subject for h in mus] == ["Van Hook Township", "Mountrail County"]
    assert [h.depends_on for h in mus] == [frozenset(), {0}]
    assert hop_subject({"question": "Who is the spouse of #1?"}) is None
    assert targets("van hook township county", mus[0]) and not targets("Van Hook", mus[0])
    assert [h.relation for h in chain] == [{"direct"}, {"born"}, {"country"}]
    assert mus[0].relation == frozenset(), "no gold sub-query: naming the subject is enough"


@pytest.mark.parametrize(
    ("query", "gold", "subject", "hit"),
    [
        ("Nurun founder", "Nurun founder", "Nurun", True),
        ("Nurun founded by", "Nurun founder", "Nurun", True),  # founder/founded share a stem
        ("Nurun based in", "Nurun founder", "Nurun", False),  # the right entity, another relation
        ("Nurun founded year", "Nurun founder", "Nurun", False),  # 1 shared stem of 2: not more than half
        ("Nurun founder", "Nurun founded year", "Nurun", False),
        ("Nurun founded year", "Nurun founded year", "Nurun", True),
        ("Siril birth year", "Siril born", "Siril", False),
        ("Kondan work", "Kondan works for", "Kondan", True),
        ("Gulel works for", "Kondan works for", "Kondan", False),  # the relation, another entity
    ],
)
def test_a_sub_query_targets_a_hop_by_subject_and_relation(query: str, gold: str, subject: str, hit: bool) -> None:
    (hop,) = oracle_hops(
        Record("q", "?", ["a"], {"decomposition": [{"question": "?", "answer": "a", "query": gold, "subject": subject}]})
    )
    assert targets(query, hop) is hit


@pytest.mark.parametrize(
    ("history", "step", "valid", "why"),
    [
        ([], search("Saenax director"), True, "open hop 1"),
        ([], search("Siril born"), False, "no open hop"),  # hop 2's subject is not known yet
        ([search("Saenax director", SAENAX_DOCS)], search("saenax director!"), False, "repeats"),
        ([search("Saenax director", SAENAX_DOCS)], search("Saenax directed by"), True, "open hop 1"),  # re-searched, other words
        ([], search("Saenax film"), False, "asks another relation"),  # the right entity, not its director
        ([], search("Saenax released"), False, "asks another relation"),
        ([search("Saenax director", SAENAX_DOCS)], conclude("Siril"), True, "supported, correct sub-answer of hop 1"),
        ([search("Saenax director", SAENAX_DOCS)], conclude("Tamal"), False, "agrees with no open hop"),
        ([], conclude("Siril"), False, "not supported"),  # right, but nothing was retrieved: a guess
        ([search("Saenax director", SAENAX_DOCS), conclude("Siril")], search("Saenax directed by"), False, "already resolved"),
        ([search("Saenax director", SAENAX_DOCS), conclude("Siril")], search("Siril born in"), True, "open hop 2"),
        ([search("Saenax director", SAENAX_DOCS), conclude("Siril")], search("Siril birth year"), False, "another relation"),
        (
            [search("Saenax director", SAENAX_DOCS), conclude("Siril"), search("Siril born", SIRIL_DOCS)],
            conclude("Tamal"),
            True,
            "hop 2",
        ),
        ([], answer("the Krirek"), False, "a guess"),  # right, but nothing was worked out
        ([], answer("Verol"), False, "wrong final answer"),
        (RESOLVED_ALL, answer("the Krirek"), True, "correct final answer"),
        (RESOLVED_ALL[:-1], answer("Krirek"), True, "correct final answer"),  # straight from hop 3's retrieval
        (RESOLVED_ALL[:-2], answer("Krirek"), False, "a guess"),  # hop 3 never searched
        (RESOLVED_ALL[:4], answer("Krirek"), False, "a guess"),  # hop 2 open
        ([], StepView("search", "Saenax director", False), False, "malformed"),
        ([], StepView(None, "", False), False, "malformed"),
    ],
)
def test_oracle_step_rules(history: list[StepView], step: StepView, valid: bool, why: str) -> None:
    ok, reason = step_verdict(CHAIN, history, step)
    assert ok is valid and why in reason


def test_oracle_accepts_either_side_of_a_comparison_first() -> None:
    assert step_verdict(COMPARE, [], search("Tamal country"))[0]
    assert step_verdict(COMPARE, [], search("Brisak based in"))[0]
    assert not step_verdict(COMPARE, [], search("Tamol country"))[0], "needs Brisak's city first"
    docs = "<retrieval>\nDoc 1(Title: Brisak) Brisak is based in Tamol.\n</retrieval>"
    assert step_verdict(COMPARE, [search("Brisak based in", docs), conclude("Tamol")], search("Tamol country"))[0]
    mus_docs = "<retrieval>\nDoc 1(Title: Van Hook) Van Hook Township is in Mountrail County.\n</retrieval>"
    assert step_verdict(MUSIQUE, [search("Van Hook Township county", mus_docs)], conclude("Mountrail County"))[0]


def test_choose_pair_prefers_high_q_valid_and_low_q_invalid() -> None:
    assert choose_pair([True, False, True, False], [0.4, 0.3, 0.6, 0.1], [3, 2, 1, 5]) == (2, 3)
    assert choose_pair([True, True], [0.4, 0.3], [1, 1]) is None, "all valid: no pair"
    assert choose_pair([False, False], [0.4, 0.3], [1, 1]) is None, "all invalid: no pair"
    # Q ties: the more visited valid step, the more visited invalid one.
    assert choose_pair([True, True, False, False], [0.5, 0.5, 0.0, 0.0], [1, 4, 2, 6]) == (1, 3)


def _request(record: Record = CHAIN) -> JudgeRequest:
    cands = [
        Candidate(search("Siril born"), q=0.8, n=5),  # a leap (invalid) that happened to score well
        Candidate(search("Saenax director"), q=0.5, n=4),
        Candidate(answer("Krirek"), q=0.2, n=1),  # right, but a guess: nothing is worked out yet
    ]
    return JudgeRequest("w4-q1@root", record, [], cands, "")


def test_oracle_judge_uses_validity_not_q() -> None:
    (j,) = OracleJudge().judge([_request()])
    assert j is not None and (j.chosen, j.rejected) == (1, 2), "the leap's high Q does not make it chosen"
    assert "open hop 1" in j.reason and "a guess" in j.reason
    assert j.verdicts is not None and [ok for ok, _ in j.verdicts] == [False, True, False]
    no_gold = Record("x", "q?", ["a"], {})
    assert OracleJudge().judge([_request(no_gold)]) == [None]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"chosen": 2, "rejected": 1, "reason": "hop 1 first"}', Judgement(1, 0, "hop 1 first")),
        ('```json\n{"chosen": 1, "rejected": 3}\n```', Judgement(0, 2, "")),
        ('{"chosen": null, "rejected": null, "reason": "all fine"}', None),
    ],
)
def test_parse_judgement_reads_strict_json(reply: str, expected: Judgement | None) -> None:
    assert parse_judgement(reply, 3) == expected


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("Candidate 2 is better.", "not JSON"),
        ('{"best": 2}', "lacks"),
        ('{"chosen": 4, "rejected": 1}', "out of range"),
        ('{"chosen": 0, "rejected": 1}', "out of range"),
        ('{"chosen": 2, "rejected": 2}', "equals"),
        ('{"chosen": 2, "rejected": null}', "out of range"),
        ('{"chosen": true, "rejected": 1}', "out of range"),
    ],
)
def test_parse_judgement_refuses_everything_else(reply: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_judgement(reply, 3)


def test_judge_prompt_shows_hints_and_candidates() -> None:
    req = _request()
    req.context_text = "<step> earlier </step><subquery> x </subquery>"
    system, user = judge_messages(req)
    assert "JSON" in system["content"] and "hints" in system["content"]
    assert "Reference answer: Krirek" in user["content"] and "earlier" in user["content"]
    assert "[1] (Q=0.80, N=5) <step> t </step><subquery> Siril born </subquery>" in user["content"]
    assert "[3] (Q=0.20, N=1)" in user["content"]


def _config(server: FakeChatServer, tmp_path: Path, **kw: Any) -> LLMTeacherConfig:
    base: dict[str, Any] = dict(
        base_url=server.url, model="fake-judge", api_key_env="PRORAG_TEST_LLM_KEY", concurrency=4, max_retries=2,
        backoff_base_s=0.01, backoff_max_s=0.02, timeout_s=5.0, max_tokens=256, cache_path=str(tmp_path / "cache.jsonl"),
    )  # fmt: skip
    return LLMTeacherConfig(**(base | kw))


def test_llm_judge_retries_bad_replies_and_caches(tmp_path: Path) -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        if "Saenax" not in user_text(body):
            return Reply(content='{"chosen": null, "rejected": null, "reason": "equal"}')
        if n == 1:
            return Reply(content="I prefer the second candidate.")  # not JSON: asked again
        return Reply(content=json.dumps({"chosen": 2, "rejected": 1, "reason": "the leap skips hop 1"}))

    other = JudgeRequest("o@root", MUSIQUE, [], [Candidate(search("a"), 0.1, 2), Candidate(search("b"), 0.2, 2)])
    with FakeChatServer(behave) as server:
        judge = LLMJudge(_config(server, tmp_path))
        out = judge.judge([_request(), other])
        assert out == [Judgement(1, 0, "the leap skips hop 1"), None]
        assert judge.usage.rejected["reply is not JSON"] == 1 and judge.failed == 0
        sent = server.n_requests
        again = LLMJudge(_config(server, tmp_path)).judge([_request(), other])
        assert again == out and server.n_requests == sent, "the reply cache answers a rerun"


def test_llm_judge_gives_no_pair_when_replies_stay_bad(tmp_path: Path) -> None:
    with FakeChatServer(lambda body, n: Reply(content="no idea")) as server:
        judge = LLMJudge(_config(server, tmp_path, cache_path=None))
        assert judge.judge([_request()]) == [None]
        assert judge.failed == 1 and server.n_requests == 3


def chain_trajectory_text() -> str:
    """A whole trajectory for :data:`CHAIN`, as text with tags: a valid search and conclusion, a
    redundant search, an unsupported conclusion and a guessed answer."""
    from prorag.agent.schema import render_conclude, render_env_turn, render_search, step_opener

    def then(action: str) -> str:  # the environment has already written the next "<step>"
        return action[len(step_opener()) :]

    docs = "Doc 1(Title: Saenax) Saenax was directed by Siril."
    return (
        render_search("I need the director.", "Saenax director")
        + render_env_turn(docs)
        + then(render_conclude("Saenax was directed by Siril.", "Siril"))
        + render_env_turn()
        + then(render_search("Again.", "Saenax director"))  # redundant: hop 1 is resolved
        + render_env_turn(docs)
        + then(render_conclude("I guess.", "Tamal"))  # hop 2's answer, but in no retrieved text
        + render_env_turn()
        + " So the answer is Krirek. </step><answer> Krirek </answer>"
    )


def test_trajectory_verdicts_judge_each_action_after_the_ones_before() -> None:
    from prorag.supervision.judge import trajectory_verdicts

    verdicts = trajectory_verdicts(CHAIN, chain_trajectory_text())
    assert [ok for ok, _ in verdicts] == [True, True, False, False, False]
    assert "redundant" in verdicts[2][1] and "not supported" in verdicts[3][1]
    assert "a guess" in verdicts[4][1], "right, but hop 3 was never searched"
