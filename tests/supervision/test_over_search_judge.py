"""HiPRAG's over-search equivalence judged by an OpenAI-compatible LLM (a local fake server): the
strict JSON verdict, unparsable replies counted as not equivalent, the reply cache, retries on 429,
the key from the environment, the ``hiprag`` reward with ``judge: llm`` on hand-made trajectories,
and a ``judge: llm`` without an endpoint refused with the field named."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from prorag.core.config import apply_overrides, load_config
from prorag.core.errors import DataError
from prorag.data.records import Record
from prorag.method.rewards.hiprag import EquivalenceEndpointConfig, HiPRAGRewardConfig, SearchCounts
from prorag.method.rewards.outcome import OUTCOME_REWARDS, OutcomeRewardConfig, RewardInputs
from prorag.models.served import ServedError
from prorag.supervision import hiprag
from prorag.supervision.equivalence import Equivalence, LLMEquivalence, equivalence_judge, parse_equivalence
from prorag.supervision.hiprag import trajectory_search_counts
from tests.fake_chat_server import FakeChatServer, Reply, user_text
from tests.supervision.test_hiprag_judgements import CHAIN, TextTokenizer, chain_text, traj

YES, NO = '{"equivalent": "yes"}', '{"equivalent": "no"}'


def endpoint(server: FakeChatServer, **kw: Any) -> EquivalenceEndpointConfig:
    base: dict[str, Any] = dict(base_url=server.url, model="fake-judge", max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02)
    return EquivalenceEndpointConfig(**(base | kw))


def same_person(body: dict[str, Any], n: int) -> Reply:
    """Says yes to "the filmmaker Siril" against Siril, chatters about "Sir", no to the rest."""
    text = user_text(body)
    if "Answer without documents: the filmmaker Siril\n" in text and "Reference answer: Siril\n" in text:
        return Reply(content=YES)
    if "Answer without documents: Sir\n" in text:
        return Reply(content="Sure, they look the same to me.")
    return Reply(content=NO)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        (YES, True),
        (' \n{"equivalent":"NO"} ', False),
        ('{"equivalent": " Yes "}', True),
        ("yes", None),
        ('{"equivalent": true}', None),
        ('{"equivalent": "yes", "why": "same"}', None),
        ('```json\n{"equivalent": "yes"}\n```', None),
        ('["yes"]', None),
        ('{"equivalent": "maybe"}', None),
    ],
)
def test_parse_equivalence_is_strict(reply: str, verdict: bool | None) -> None:
    assert parse_equivalence(reply) is verdict


def test_llm_judge_verdicts_and_unparsable_replies(caplog: pytest.LogCaptureFixture) -> None:
    items = [
        Equivalence("Saenax director", "the filmmaker Siril", "Siril"),  # yes
        Equivalence("Tamal country", "Verol", "Krirek"),  # no
        Equivalence("Saenax director", "Sir", "Siril"),  # unparsable: not equivalent, counted
        Equivalence("Tamal country", "krirek.", "Krirek"),  # exact match: equivalent, not asked
        Equivalence("Saenax director", "the filmmaker Siril", "Siril"),  # a repeat: asked once
    ]
    with FakeChatServer(same_person) as server, caplog.at_level(logging.WARNING):
        judge = LLMEquivalence(endpoint(server))
        assert judge(items) == [True, False, False, True, True]
    assert server.n_requests == 3 and judge.asked == 3 and judge.unparsable == 1
    assert "unparsable reply 'Sure, they look the same to me.'" in caplog.text
    bodies = [r.body for r in server.seen]  # sent concurrently: in any order
    assert all(b["model"] == "fake-judge" and b["temperature"] == 0.0 and b["max_tokens"] == 16 for b in bodies)
    assert all([m["role"] for m in b["messages"]] == ["user"] for b in bodies)  # a chat endpoint by default
    asked = sorted(user_text(b).split("Sub-question: ")[1].split("\n")[0] for b in bodies)
    assert asked == ["Saenax director", "Saenax director", "Tamal country"]
    assert all('{"equivalent": "no"}' in user_text(b) for b in bodies)


def test_cached_verdicts_make_no_second_request(tmp_path: Path) -> None:
    items = [Equivalence("Saenax director", "the filmmaker Siril", "Siril"), Equivalence("Tamal country", "Verol", "Krirek")]
    cache = str(tmp_path / "judge_cache.jsonl")
    with FakeChatServer(same_person) as server:
        assert LLMEquivalence(endpoint(server, cache_path=cache))(items) == [True, False]
        assert server.n_requests == 2 and len(Path(cache).read_text().splitlines()) == 2
        again = LLMEquivalence(endpoint(server, cache_path=cache))
        assert again(items) == [True, False]
        assert server.n_requests == 2 and again.generator.usage.cache_hits == 2
        # Another judge model is another key: asked again.
        LLMEquivalence(endpoint(server, cache_path=cache, model="other-judge"))(items[:1])
        assert server.n_requests == 3


def test_a_429_is_retried_and_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRORAG_TEST_JUDGE_KEY", "sk-judge-secret")

    def busy_first(body: dict[str, Any], n: int) -> Reply:
        return Reply(status=429, headers={"Retry-After": "0"}) if n == 1 else same_person(body, n)

    with FakeChatServer(busy_first) as server:
        judge = LLMEquivalence(endpoint(server, api_key_env="PRORAG_TEST_JUDGE_KEY"))
        assert judge([Equivalence("Saenax director", "the filmmaker Siril", "Siril")]) == [True]
    assert [s.n for s in server.seen] == [1, 2]
    assert judge.generator.usage.errors["http 429"] == 1 and judge.generator.usage.retries == 1
    assert all(s.headers.get("Authorization") == "Bearer sk-judge-secret" for s in server.seen)
    monkeypatch.delenv("PRORAG_TEST_JUDGE_KEY")
    with pytest.raises(ServedError, match="PRORAG_TEST_JUDGE_KEY"):
        LLMEquivalence(endpoint(server, api_key_env="PRORAG_TEST_JUDGE_KEY"))


def test_hiprag_reward_with_the_llm_judge_hand_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-asked without documents: hop 1 "the filmmaker Siril" (not an exact match of Siril, the
    # judge says the same: over-search), hop 3 "Verol" (wrong: the search was needed).
    monkeypatch.setattr(hiprag, "reask", lambda *a, **k: {"Saenax director": "the filmmaker Siril", "Tamal country": "Verol"})
    tok = TextTokenizer([chain_text()])
    with FakeChatServer(same_person) as server:
        oracle = OUTCOME_REWARDS.get("hiprag")(OutcomeRewardConfig(form="hiprag"))
        cfg = OutcomeRewardConfig(form="hiprag", hiprag=HiPRAGRewardConfig(judge="llm", llm=endpoint(server)))
        llm = OUTCOME_REWARDS.get("hiprag")(cfg)
        # A = F = 1; steps: search hop 1, non-search Tamal (right), search hop 3.
        assert oracle(RewardInputs([traj(0)], [["Krirek"]], tok, [CHAIN], policy=object())) == pytest.approx(
            [0.8 + 0.2 + 0.4 * 3 / 3]
        )
        assert llm(RewardInputs([traj(0)], [["Krirek"]], tok, [CHAIN], policy=object())) == pytest.approx(
            [0.8 + 0.2 + 0.4 * 2 / 3]
        )
        asked = [user_text(s.body) for s in server.seen]
        assert len(asked) == 2 and any("Reference answer: Krirek\n" in a for a in asked)  # hop 3's gold sub-answer
        # No decomposition: the reference is the step's own conclusion; the counts use the same judge.
        bare = Record("q", CHAIN.question, ["Krirek"])
        answers = {"Saenax director": "the filmmaker Siril", "Tamal country": "Verol"}
        counts = trajectory_search_counts(bare, chain_text(), answers, llm.judge)
        assert counts == SearchCounts(search=2, over=1, non_search=1, under=0)
        assert trajectory_search_counts(bare, chain_text(), answers) == SearchCounts(2, 0, 1, 0)  # the oracle


def test_llm_judge_without_an_endpoint_is_refused_naming_the_field(tmp_path: Path) -> None:
    from prorag.evaluation.eval_config import EvalConfig
    from prorag.stages.rl import RLConfig

    with pytest.raises(
        ValueError, match=r"outcome_reward.hiprag.judge=llm: HiPRAGRewardConfig.llm must be set when judge is 'llm'"
    ):
        apply_overrides(RLConfig(), ["outcome_reward.form=hiprag", "outcome_reward.hiprag.judge=llm"])
    with pytest.raises(ValueError, match=r"OverSearchJudgeConfig.llm must be set"):
        apply_overrides(EvalConfig(), ["over_search=true", "over_search_judge.judge=llm"])
    with pytest.raises(ValueError, match=r"field 'judge': expected 'oracle' or 'llm', got str 'gpt'"):
        apply_overrides(RLConfig(), ["outcome_reward.hiprag.judge=gpt"])
    path = tmp_path / "rl.yaml"
    path.write_text("outcome_reward:\n  form: hiprag\n  hiprag:\n    judge: llm\n")
    with pytest.raises(DataError, match=rf"{path}.*HiPRAGRewardConfig.llm must be set"):
        load_config(path, RLConfig)
    assert equivalence_judge(HiPRAGRewardConfig()) is hiprag.ORACLE
