"""The LLM teacher against a local chat-completions server: prompts that never show later hops,
retries (429 with Retry-After, 5xx, timeouts), rejected replies, the reply cache, the key, usage."""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import pytest

from prorag.agent.gold import gold_hops
from prorag.data.records import Record, read_records
from prorag.retrieval.base import format_documents
from prorag.retrieval.bm25 import BM25Retriever
from prorag.supervision.llm_teacher import (
    LLMTeacher,
    LLMTeacherConfig,
    LLMTeacherError,
    RecordThoughts,
    TeacherItem,
    backoff_delay,
    check_thought,
    parse_retry_after,
    request_key,
    thought_requests,
)
from tests.fake_chat_server import COMPLETION_TOKENS, PROMPT_TOKENS, FakeChatServer, Reply, good_thought, user_text


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")


def item_of(record: Record, retriever: BM25Retriever) -> TeacherItem:
    hops = gold_hops(record)
    hits = retriever.search([h.query for h in hops], k=3, partitions=[record.partition] * len(hops))
    return TeacherItem(record, hops, hits)


@pytest.fixture(scope="module")
def items(records: list[Record], tiny_retriever: BM25Retriever) -> list[TeacherItem]:
    return [item_of(r, tiny_retriever) for r in records[:6]]


def config(server: FakeChatServer, tmp_path: Path | None = None, **kw: Any) -> LLMTeacherConfig:
    base: dict[str, Any] = dict(
        base_url=server.url,
        model="fake-teacher",
        api_key_env="PRORAG_TEST_LLM_KEY",
        concurrency=4,
        max_retries=3,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        timeout_s=5.0,
        cache_path=str(tmp_path / "cache.jsonl") if tmp_path else None,
    )
    return LLMTeacherConfig(**(base | kw))


def asks(body: dict[str, Any], record: Record, kind: str, hop: int = 0) -> bool:
    """Whether ``body`` asks for ``record``'s thought of this kind (and hop)."""
    text = user_text(body)
    if f"Question: {record.question}\n" not in text:
        return False
    hops = gold_hops(record)
    if kind == "search":
        return f'Next action: search for "{hops[hop].query}"' in text
    if kind == "conclude":
        return f'The assistant searched "{hops[hop].query}"' in text
    return "Next action: give the final answer" in text


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "text,reason",
    [
        ("I need the director of Raezax first.", None),
        ("  I need the director of Raezax first.  \n", None),
        ("", "empty"),
        ("   \n ", "empty"),
        ("First line.\nSecond line.", "several lines"),
        ("x" * 401, "too long"),
        ("I will search <subquery> Raezax </subquery>", "contains a tag"),
        ("Done. </step>", "contains a tag"),
        ("Now < / ANSWER > it", "contains a tag"),
        ("Comparing a<b and b>c is fine.", None),
    ],
)
def test_check_thought(text: str, reason: str | None) -> None:
    assert check_thought(text, max_chars=400) == reason


def test_check_thought_refuses_a_search_thought_that_states_its_result() -> None:
    leak = "The director of Raezax is Kothir, let me confirm."
    assert check_thought(leak, max_chars=400, withheld="Kothir", shown="Who directed Raezax? Raezax director") == (
        "states the sub-answer before searching"
    )
    # Already shown to the policy (e.g. in the question): not a leak.
    assert check_thought(leak, max_chars=400, withheld="Kothir", shown="Did Kothir direct Raezax?") is None
    # Whole words only: "Kothiran" does not state "Kothir".
    assert check_thought("Kothiran films come next.", max_chars=400, withheld="Kothir", shown="") is None


def test_parse_retry_after_and_backoff() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(10, abs=1.0)
    assert parse_retry_after(email.utils.formatdate(now - 10, usegmt=True), now=now) == 0.0
    rng = random.Random(0)
    for attempt in range(8):
        top = min(4.0, 0.5 * 2**attempt)
        d = backoff_delay(attempt, 0.5, 4.0, rng)
        assert top / 2 <= d <= top
    assert request_key({"a": 1, "b": [1, 2]}) == request_key({"b": [1, 2], "a": 1}) != request_key({"a": 2, "b": [1, 2]})


def test_prompts_never_show_a_later_hop(records: list[Record], tiny_retriever: BM25Retriever) -> None:
    record = next(r for r in records if len(gold_hops(r)) >= 3 and r.metadata["type"] == "chain")
    item = item_of(record, tiny_retriever)
    reqs = thought_requests(item)
    hops = item.hops
    assert [(r.kind, r.hop) for r in reqs] == [(k, i) for i in range(len(hops)) for k in ("search", "conclude")] + [
        ("answer", -1)
    ]
    for r in reqs:
        text = user_text({"messages": r.messages})
        assert record.question in text
        upto = len(hops) if r.kind == "answer" else r.hop + 1
        # Nothing of a later hop: its sub-question, keywords or answer (outside the retrieved
        # documents, which the policy does see and which may mention anything).
        told = text.replace(format_documents(item.hits[r.hop]), "") if r.kind == "conclude" else text
        for later in hops[upto:]:
            assert later.question not in told and later.query not in told and later.answer not in told
        if r.kind == "search":  # before the search: neither its documents nor its result
            assert format_documents(item.hits[r.hop]) not in text
            assert hops[r.hop].answer not in text
            assert r.withheld == hops[r.hop].answer
        if r.kind == "conclude":
            assert format_documents(item.hits[r.hop]) in text and f'conclude "{hops[r.hop].answer}"' in text
        if r.kind == "answer":
            assert all(h.answer in text for h in hops) and record.golden_answers[0] in text


# ----------------------------------------------------------------------------- against the server


def test_thoughts_key_usage_and_concurrency(
    tmp_path: Path, items: list[TeacherItem], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("PRORAG_TEST_LLM_KEY", secret)
    caplog.set_level(logging.DEBUG)
    with FakeChatServer(lambda body, n: Reply(content=good_thought(body), delay=0.05)) as server:
        cfg = config(server, tmp_path, concurrency=3, price_input_per_1k=1.0, price_output_per_1k=2.0)
        teacher = LLMTeacher(cfg)
        out = teacher.write_thoughts(items)
    n_thoughts = sum(2 * len(i.hops) + 1 for i in items)
    assert server.n_requests == n_thoughts
    assert 2 <= server.max_in_flight <= 3
    assert all(s.headers.get("Authorization") == f"Bearer {secret}" for s in server.seen)
    assert all(s.body["model"] == "fake-teacher" and s.body["temperature"] == 0.0 for s in server.seen)
    # Each thought is the server's reply to that thought's own prompt.
    for item in items:
        got = out[item.record.id]
        assert isinstance(got, RecordThoughts)
        reqs = thought_requests(item)
        expected = [good_thought({"messages": r.messages}) for r in reqs]
        assert got.search + got.conclude + [got.answer] == [e for e, r in zip(expected, reqs) if r.kind == "search"] + [
            e for e, r in zip(expected, reqs) if r.kind == "conclude"
        ] + [expected[-1]]
    usage = teacher.usage
    assert usage.thoughts == n_thoughts and usage.retries == 0 and usage.failed_thoughts == 0
    assert (usage.prompt_tokens, usage.completion_tokens) == (PROMPT_TOKENS * n_thoughts, COMPLETION_TOKENS * n_thoughts)
    assert usage.cost(cfg) == pytest.approx((PROMPT_TOKENS * 1.0 + COMPLETION_TOKENS * 2.0) * n_thoughts / 1000)
    described = usage.describe(cfg)
    assert f"{PROMPT_TOKENS * n_thoughts} prompt" in described and "estimated cost" in described
    # The key is sent, never written anywhere.
    assert secret not in caplog.text and secret not in described
    assert secret not in (tmp_path / "cache.jsonl").read_text()


def test_retries_on_429_5xx_and_timeouts(items: list[TeacherItem]) -> None:
    a, b, c = (i.record for i in items[:3])

    def behave(body: dict[str, Any], n: int) -> Reply:
        if asks(body, a, "search") and n == 1:
            return Reply(status=429, headers={"Retry-After": "1"})
        if asks(body, b, "conclude") and n <= 2:
            return Reply(status=500 if n == 1 else 503)
        if asks(body, c, "answer") and n == 1:
            return Reply(content="too late", delay=3.0)  # the client times out first
        return Reply(content=good_thought(body))

    with FakeChatServer(behave) as server:
        teacher = LLMTeacher(config(server, timeout_s=1.0, max_retries=3))
        out = teacher.write_thoughts(items[:3])
    assert all(isinstance(out[i.record.id], RecordThoughts) for i in items[:3])
    usage = teacher.usage
    assert usage.errors["http 429"] == 1 and usage.errors["http 500"] == 1 and usage.errors["http 503"] == 1
    assert usage.errors["timeout"] >= 1 and usage.failed_thoughts == 0
    assert "too late" not in out[c.id].answer  # type: ignore[union-attr]
    seen_a = [s for s in server.seen if asks(s.body, a, "search")]
    assert [s.n for s in seen_a] == [1, 2]
    assert seen_a[1].at - seen_a[0].at >= 0.9  # Retry-After: 1 honoured (the backoff alone is < 0.05 s)
    assert [s.n for s in server.seen if asks(s.body, b, "conclude")] == [1, 2, 3]
    assert [s.n for s in server.seen if asks(s.body, c, "answer")][:2] == [1, 2]


def test_rejected_replies_are_retried_then_the_record_fails(items: list[TeacherItem]) -> None:
    a, b, c, d, e = (i.record for i in items[:5])

    def behave(body: dict[str, Any], n: int) -> Reply:
        if asks(body, a, "answer") and n == 1:
            return Reply(payload={"choices": [{"index": 0}]})  # no message: malformed, then fine
        if asks(body, e, "search") and n == 1:
            return Reply(content="I will look for the", finish_reason="length")  # cut, then fine
        if asks(body, b, "conclude"):
            return Reply(content="<step> The documents say so. </step>")  # always a tag
        if asks(body, c, "search"):
            return Reply(content="  ")  # always empty
        if asks(body, d, "answer"):
            return Reply(payload={"object": "error"})  # always malformed
        return Reply(content=good_thought(body))

    with FakeChatServer(behave) as server:
        teacher = LLMTeacher(config(server, max_retries=2))
        out = teacher.write_thoughts(items[:5])
    assert isinstance(out[a.id], RecordThoughts) and isinstance(out[e.id], RecordThoughts)
    assert out[b.id] is None and out[c.id] is None and out[d.id] is None
    usage = teacher.usage
    assert usage.failed_thoughts == 3
    assert usage.rejected["contains a tag"] == 3 and usage.rejected["empty"] == 3
    assert usage.rejected["malformed reply"] == 1 + 3 and usage.rejected["cut by max_tokens"] == 1
    assert [s.n for s in server.seen if asks(s.body, b, "conclude")] == [1, 2, 3]  # 1 + max_retries


def test_cache_prevents_repeat_requests(tmp_path: Path, items: list[TeacherItem]) -> None:
    with FakeChatServer() as server:
        first = LLMTeacher(config(server, tmp_path)).write_thoughts(items[:3])
        n = server.n_requests
        assert n == sum(2 * len(i.hops) + 1 for i in items[:3])
        assert len((tmp_path / "cache.jsonl").read_text().splitlines()) == n
        again = LLMTeacher(config(server, tmp_path))
        second = again.write_thoughts(items[:3])
        assert server.n_requests == n  # nothing asked again
        assert second == first and again.usage.cache_hits == n and again.usage.requests == 0
        # A stricter check re-asks the cached replies it now refuses.
        strict = LLMTeacher(config(server, tmp_path, max_thought_chars=20))
        strict.write_thoughts(items[:1])
        assert server.n_requests > n and strict.usage.cache_hits == 0
    # Rows written by a killed run: the cut last line is ignored.
    with (tmp_path / "cache.jsonl").open("a") as f:
        f.write('{"key": "abc", "content": "cut')
    with FakeChatServer() as server:
        LLMTeacher(config(server, tmp_path)).write_thoughts(items[:3])
        assert server.n_requests == 0


def test_fatal_status_stops_the_run_without_leaking_the_key(items: list[TeacherItem], monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-live-should-never-show"
    monkeypatch.setenv("PRORAG_TEST_LLM_KEY", secret)

    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(status=401, payload={"error": {"message": f"Incorrect API key provided: {secret}"}})

    with FakeChatServer(behave) as server:
        with pytest.raises(LLMTeacherError, match="HTTP 401") as err:
            LLMTeacher(config(server)).write_thoughts(items[:2])
        assert server.n_requests < sum(2 * len(i.hops) + 1 for i in items[:2])  # stopped at once
        assert all(s.n == 1 for s in server.seen)  # never retried
    assert secret not in str(err.value) and "***" in str(err.value)


def test_other_4xx_fails_that_thought_only(items: list[TeacherItem]) -> None:
    a = items[0].record

    def behave(body: dict[str, Any], n: int) -> Reply:
        if asks(body, a, "search"):
            return Reply(status=400)
        return Reply(content=good_thought(body))

    with FakeChatServer(behave) as server:
        teacher = LLMTeacher(config(server))
        out = teacher.write_thoughts(items[:2])
    assert out[a.id] is None and isinstance(out[items[1].record.id], RecordThoughts)
    assert [s.n for s in server.seen if asks(s.body, a, "search")] == [1]  # not retried
    assert teacher.usage.errors["http 400"] == 1


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="base_url"):
        LLMTeacherConfig(base_url="api.openai.com", model="m")
    with pytest.raises(ValueError, match="concurrency"):
        LLMTeacherConfig(base_url="https://x/v1", model="m", concurrency=0)
    assert LLMTeacherConfig(base_url="https://x/v1/", model="m").url == "https://x/v1/chat/completions"
    assert json.dumps(LLMTeacherConfig(base_url="https://x/v1", model="m").__dict__)  # plain, serialisable


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("https://api.example.com/v1", True),
        ("http://127.0.0.1:8000/v1", True),
        ("http://127.8.9.1/v1", True),
        ("http://localhost:8000/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://api.example.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
        ("http://127.0.0.1.example.com/v1", False),
    ],
)
def test_plain_http_only_to_loopback_unless_allowed(url: str, safe: bool) -> None:
    if safe:
        assert LLMTeacherConfig(base_url=url, model="m").base_url == url
    else:
        with pytest.raises(ValueError, match="unencrypted.*allow_insecure_http"):
            LLMTeacherConfig(base_url=url, model="m")
        assert LLMTeacherConfig(base_url=url, model="m", allow_insecure_http=True).base_url == url


def test_missing_key_is_an_error_before_any_request(items: list[TeacherItem], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRORAG_TEST_LLM_KEY")
    with FakeChatServer(lambda body, n: Reply(content=good_thought(body))) as server:
        with pytest.raises(LLMTeacherError, match="PRORAG_TEST_LLM_KEY.*not set"):
            LLMTeacher(config(server)).write_thoughts(items[:1])
        assert server.n_requests == 0
        # A local server that needs no key: api_key_env null, and no Authorization header goes out.
        out = LLMTeacher(config(server, api_key_env=None)).write_thoughts(items[:1])
        assert isinstance(out[items[0].record.id], RecordThoughts)
        assert server.n_requests > 0 and all("Authorization" not in s.headers for s in server.seen)
