"""The served backend against a local fake OpenAI-compatible server (tests/fake_chat_server.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from prorag.core.config import load_config
from prorag.core.errors import DataError, ServiceUnavailableError
from prorag.models.endpoint_config import ServedConfig
from prorag.models.generator import Generation, Sampling, ScriptedGenerator
from prorag.models.served import ReplyTooLarge, RequestCounts, Retry, ServedError, ServedGenerator, post, retrying
from tests.fake_chat_server import COMPLETION_TOKENS, PROMPT_TOKENS, FakeChatServer, Reply, user_text


def echo(body: dict[str, Any], n: int) -> Reply:
    return Reply(content=f"re: {user_text(body)}")


def make(server: FakeChatServer, **kw: Any) -> tuple[ServedGenerator, list[float]]:
    """A generator on ``server`` whose backoff sleeps are recorded, not slept."""
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    kw = {"max_retries": 3, "timeout_s": 5.0, **kw}
    return ServedGenerator(ServedConfig(base_url=server.url, model="m", **kw), sleep=sleep, rng=random.Random(0)), slept


def test_completions_request_and_reply() -> None:
    with FakeChatServer(echo) as server:
        gen, _ = make(server)
        out = gen.generate(["Q: a", "Q: b"], max_tokens=12, stop=["\n"])
    assert [g.text for g in out] == ["re: Q: a", "re: Q: b"]
    assert all(g.token_logprobs is None and g.tokens is None and g.finish_reason == "stop" for g in out)
    assert (out[0].prompt_tokens, out[0].completion_tokens) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    seen = server.seen[0]
    assert seen.path == "/v1/completions"
    assert {k: seen.body[k] for k in ("model", "max_tokens", "temperature", "stop")} == {
        "model": "m",
        "max_tokens": 12,
        "temperature": 0.0,
        "stop": ["\n"],
    }
    assert "logprobs" not in seen.body and "Authorization" not in seen.headers  # local server, no key
    assert gen.usage.requests == 2 and gen.usage.prompt_tokens == 2 * PROMPT_TOKENS


def test_completions_logprobs_parsed() -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(content="Paris is", tokens=["Paris", " is"], logprobs=[-0.25, -3.5])

    with FakeChatServer(behave) as server:
        gen, _ = make(server)
        (g,) = gen.generate(["Capital?"], max_tokens=4, logprobs=True)
    assert server.seen[0].body["logprobs"] == 1
    assert g.tokens == ["Paris", " is"] and g.token_logprobs == [-0.25, -3.5]


def test_chat_messages_and_logprobs() -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(content="yes no", logprobs=[-1.0, -2.0], finish_reason="length")

    with FakeChatServer(behave) as server:
        gen, _ = make(server, api="chat", system_prompt="Be brief.")
        (g,) = gen.generate(["Is it?"], max_tokens=2, logprobs=True)
    seen = server.seen[0]
    assert seen.path == "/v1/chat/completions" and seen.body["logprobs"] is True
    assert seen.body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is it?"}]
    assert g == Generation("yes no", [-1.0, -2.0], ["yes", " no"], PROMPT_TOKENS, COMPLETION_TOKENS, "length")


def test_order_kept_under_concurrency() -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        i = int(user_text(body).split()[-1])
        return Reply(content=f"answer {i}", delay=0.01 * (i % 5))  # later prompts often finish first

    prompts = [f"prompt {i}" for i in range(24)]
    with FakeChatServer(behave) as server:
        gen, _ = make(server, concurrency=6)
        out = gen.generate(prompts, max_tokens=4)
    assert [g.text for g in out] == [f"answer {i}" for i in range(24)]
    assert 1 < server.max_in_flight <= 6


def test_cache_hit_on_rerun_and_sampled_not_cached(tmp_path: Path) -> None:
    cache = tmp_path / "cache.jsonl"
    with FakeChatServer(echo) as server:
        gen, _ = make(server, cache_path=str(cache))
        first = gen.generate(["a", "b", "a"], max_tokens=4, logprobs=True)
        assert server.n_requests == 2  # identical greedy requests of one batch go out once
        again, _ = make(server, cache_path=str(cache))  # a rerun: a new process reads the file
        second = again.generate(["b", "a"], max_tokens=4, logprobs=True)
        assert server.n_requests == 2 and again.usage.cache_hits == 2 and again.usage.requests == 0
        assert second == [first[1], first[0]] and second[0].token_logprobs is not None
        again.generate(["a"], max_tokens=5)  # other settings: another request
        assert server.n_requests == 3
        again.generate(["a", "a"], max_tokens=4, temperature=0.7)  # samples: each asked, never cached
        again.generate(["a"], max_tokens=4, temperature=0.7)
        assert server.n_requests == 6
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(rows) == 3 and all(r["reply"]["text"].startswith("re: ") for r in rows)


def test_timeout_then_success() -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        return Reply(content="late", delay=1.0) if n == 1 else Reply(content="ok")

    with FakeChatServer(behave) as server:
        gen, slept = make(server, timeout_s=0.2)
        (g,) = gen.generate(["x"], max_tokens=4)
    assert g.text == "ok" and gen.usage.errors["timeout"] == 1 and gen.usage.retries == 1 and len(slept) == 1


def test_500s_then_success_honour_retry_after_capped() -> None:
    def behave(body: dict[str, Any], n: int) -> Reply:
        if n == 1:
            return Reply(status=503, headers={"Retry-After": "7"})
        if n == 2:
            return Reply(status=500, headers={"Retry-After": "9999"})
        return Reply(content="ok")

    with FakeChatServer(behave) as server:
        gen, slept = make(server, max_retry_after_s=60.0)
        (g,) = gen.generate(["x"], max_tokens=4)
    assert g.text == "ok" and server.n_requests == 3
    assert slept == [7.0, 60.0]
    assert gen.usage.errors == {"http 503": 1, "http 500": 1}


@pytest.mark.parametrize(
    "bad",
    [
        Reply(payload=b'{"choices": [{"text": "cut'),  # not JSON
        Reply(payload={"choices": []}),  # JSON, not the schema
        Reply(payload={"choices": [{"text": "no logprobs", "logprobs": None}]}),  # asked for, missing
    ],
)
def test_malformed_reply_retried(bad: Reply) -> None:
    with FakeChatServer(lambda body, n: bad if n == 1 else Reply(content="ok")) as server:
        gen, _ = make(server)
        (g,) = gen.generate(["x"], max_tokens=4, logprobs=True)
    assert g.text == "ok" and gen.usage.errors["malformed"] == 1 and server.n_requests == 2


def test_all_retries_failing_is_one_clear_error() -> None:
    with FakeChatServer(lambda body, n: Reply(status=502) if "bad" in user_text(body) else Reply(content="ok")) as server:
        gen, slept = make(server, max_retries=2, backoff_base_s=1.0, backoff_max_s=1.5)
        with pytest.raises(ServiceUnavailableError) as e:
            gen.generate(["good", "bad"], max_tokens=4)
    assert str(e.value).startswith(f"{server.url}/completions: no valid reply after 3 attempts; last error: HTTP 502")
    assert len(slept) == 2 and all(0.5 <= s <= 1.5 for s in slept)


def test_fatal_status_stops_at_once_and_key_is_redacted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVED_TEST_KEY", "sk-secret-123")
    with FakeChatServer(lambda body, n: Reply(status=401, payload={"error": "bad key sk-secret-123"})) as server:
        gen, _ = make(server, api_key_env="SERVED_TEST_KEY", cache_path=str(tmp_path / "c.jsonl"))
        with pytest.raises(ServedError, match="HTTP 401") as e:
            gen.generate(["x"], max_tokens=4)
    assert server.n_requests == 1 and "sk-secret-123" not in str(e.value) and "***" in str(e.value)
    assert server.seen[0].headers["Authorization"] == "Bearer sk-secret-123"


def test_missing_key_refused_before_any_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVED_TEST_KEY", raising=False)
    with FakeChatServer(echo) as server:
        with pytest.raises(ServedError, match="SERVED_TEST_KEY"):
            make(server, api_key_env="SERVED_TEST_KEY")
    assert server.n_requests == 0


def test_insecure_http_refused() -> None:
    with pytest.raises(ValueError, match="allow_insecure_http"):
        ServedConfig(base_url="http://gpu-box.lan:8000/v1", model="m")
    ServedConfig(base_url="http://gpu-box.lan:8000/v1", model="m", allow_insecure_http=True)
    for url in ("https://api.example.com/v1", "http://localhost:8000/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1"):
        ServedConfig(base_url=url, model="m")


def test_config_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "served.yaml"
    path.write_text("base_url: http://127.0.0.1:8000/v1\nmodel: Qwen/Qwen3-8B\napi: chat\nconcurrency: 32\n")
    cfg = load_config(path, ServedConfig)
    assert (cfg.api, cfg.concurrency, cfg.api_key_env, cfg.url) == ("chat", 32, None, "http://127.0.0.1:8000/v1/chat/completions")
    path.write_text("base_url: http://127.0.0.1:8000/v1\nmodel: m\napi: responses\n")
    with pytest.raises(DataError, match="api"):
        load_config(path, ServedConfig)


def test_generate_inside_a_running_event_loop() -> None:
    with FakeChatServer(echo) as server:
        gen, _ = make(server)

        async def main() -> list[Generation]:
            return gen.generate(["x"], max_tokens=4)

        assert [g.text for g in asyncio.run(main())] == ["re: x"]


def test_interrupted_batch_keeps_finished_replies(tmp_path: Path) -> None:
    cache = tmp_path / "cache.jsonl"
    broken = True

    def behave(body: dict[str, Any], n: int) -> Reply:
        if broken and user_text(body) == "late":
            return Reply(status=503, delay=0.2)  # fails after the others are done
        return Reply(content=f"re: {user_text(body)}")

    with FakeChatServer(behave) as server:
        gen, _ = make(server, max_retries=1, cache_path=str(cache))
        with pytest.raises(ServiceUnavailableError):
            gen.generate(["a", "b", "late"], max_tokens=4)
        assert server.n_requests == 4
        broken = False
        rerun, _ = make(server, cache_path=str(cache))
        assert [g.text for g in rerun.generate(["a", "b", "late"], max_tokens=4)] == ["re: a", "re: b", "re: late"]
    assert server.n_requests == 5 and rerun.usage.cache_hits == 2


def test_retrying_counts_waits_and_gives_up() -> None:
    """The one retry loop: a Retry with a kind is counted in errors (None: counted by the caller);
    the server's Retry-After replaces the backoff, capped; after max_retries retries it gives up."""
    config = ServedConfig(base_url="http://127.0.0.1:1/v1", model="m", max_retries=2, max_retry_after_s=5.0)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    def run(failures: list[Retry]) -> tuple[str, RequestCounts]:
        counts, left = RequestCounts(), list(failures)

        async def attempt() -> str:
            if left:
                raise left.pop(0)
            return "ok"

        return asyncio.run(retrying(attempt, config, counts, url="U", sleep=sleep, rng=random.Random(0))), counts

    got, counts = run([Retry("http 429", "busy", wait=60.0), Retry(None, "rejected", wait=1.5)])
    assert got == "ok" and counts.retries == 2 and counts.errors == {"http 429": 1} and slept == [5.0, 1.5]
    with pytest.raises(ServiceUnavailableError, match="U: no valid reply after 3 attempts; last error: third"):
        run([Retry("timeout", "first"), Retry("timeout", "second"), Retry("timeout", "third")])


def test_generate_hands_backends_one_sampling() -> None:
    """generate's keyword form becomes one Sampling for every backend; max_tokens < 1 is refused."""
    seen: list[Sampling] = []

    class Recording(ScriptedGenerator):
        def complete(self, prompts, sampling):  # noqa: ANN001, ANN202 - the backend hook
            seen.append(sampling)
            return super().complete(prompts, sampling)

    gen = Recording(lambda p: "a\nb")
    assert [g.text for g in gen.generate(["x"], max_tokens=3, stop=["\n"], logprobs=True)] == ["a"]
    assert seen == [Sampling(3, ("\n",), 0.0, True)]
    with pytest.raises(ValueError, match="max_tokens must be >= 1, got 0"):
        gen.generate(["x"], max_tokens=0)


# ----------------------------------------------------------------------------- issue 70: wedged and oversized replies


def test_a_stalled_reply_trips_the_read_timeout_with_one_line_per_retry(caplog: pytest.LogCaptureFixture) -> None:
    """A server that sends its headers and then nothing is given up on after ``read_timeout_s``, not
    ``timeout_s``; each retry is one warning line (what failed, attempt k of n); httpx's own
    per-request INFO line ("200 OK" for a reply that never came) is not shown."""
    caplog.set_level(logging.INFO)
    with FakeChatServer(lambda body, n: Reply(content="never", stall=5.0)) as server:
        gen, slept = make(server, max_retries=2, timeout_s=60.0, read_timeout_s=0.3)
        start = time.monotonic()
        with pytest.raises(ServiceUnavailableError, match="stalled") as e:
            gen.generate(["x"], max_tokens=4)
        took = time.monotonic() - start
    assert took < 4.0 and server.n_requests == 3 and gen.usage.errors == {"timeout": 3}
    assert str(e.value).startswith(f"{server.url}/completions: no valid reply after 3 attempts")
    lines = [r for r in caplog.records if r.name == "prorag.models.served" and "retrying" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    for k, record in enumerate(lines, 1):
        message = record.getMessage()
        assert message.startswith(f"{server.url}/completions: attempt {k} of 3 failed (the reply stalled"), message
        assert f"retrying in {slept[k - 1]:.1f} s" in message
    assert not [r for r in caplog.records if r.name.startswith("httpx")]


def test_a_reply_that_comes_in_time_is_not_cut_by_the_read_timeout() -> None:
    """The read timeout is silence after the headers: a long generation before them is ``timeout_s``'s."""
    with FakeChatServer(lambda body, n: Reply(content="slow but fine", delay=0.5)) as server:
        gen, _ = make(server, read_timeout_s=0.2)
        (g,) = gen.generate(["x"], max_tokens=4)
    assert g.text == "slow but fine" and gen.usage.retries == 0


def test_connect_timeout_is_its_own_setting() -> None:
    """Connecting gets ``connect_timeout_s``, not the whole request's ``timeout_s``; its failure says so."""
    seen: list[dict[str, Any]] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        raise httpx.ConnectTimeout("slow", request=request)

    config = ServedConfig(base_url="http://127.0.0.1:1/v1", model="m", timeout_s=90.0, connect_timeout_s=2.5)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
            await post(http, config.url, {"x": 1}, config=config, redact=str)

    with pytest.raises(Retry, match=r"could not connect within 2.5 s \(connect_timeout_s\)") as e:
        asyncio.run(go())
    assert e.value.kind == "timeout" and seen[0]["connect"] == 2.5 and seen[0]["read"] == 90.0


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_reply_over_max_reply_bytes_is_refused_at_once_naming_the_endpoint(chunked: bool) -> None:
    """A huge but valid JSON reply is not written through: refused while it streams (chunked: no
    Content-Length to refuse it from), not asked again."""
    huge = Reply(content="x" * (300 * 1024), chunked=chunked)
    with FakeChatServer(lambda body, n: huge) as server:
        gen, _ = make(server, max_reply_bytes=64 * 1024)
        with pytest.raises(ReplyTooLarge) as e:
            gen.generate(["x"], max_tokens=4)
        assert server.n_requests == 1
        expected = "the reply grew past max_reply_bytes" if chunked else r"a reply of 30\d{4} bytes is over max_reply_bytes"
        assert re.match(re.escape(f"{server.url}/completions: ") + expected, str(e.value)), str(e.value)
        assert "max_reply_bytes (65536)" in str(e.value) and "check the server" in str(e.value)
        gen, _ = make(server)  # under the default cap
        assert gen.generate(["x"], max_tokens=4)[0].text == huge.content


def test_api_key_env_none_means_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--api-key-env none`` (a string, as the command line and YAML give it) means the server needs no key."""
    monkeypatch.delenv("none", raising=False)
    with FakeChatServer(echo) as server:
        for spelled in ("none", "None", "NONE", ""):
            gen, _ = make(server, api_key_env=spelled)
            assert gen.config.api_key_env is None
            assert gen.generate(["x"], max_tokens=4)[0].text == "re: x"
        assert all("Authorization" not in s.headers for s in server.seen)


def test_a_prompt_over_the_context_is_an_empty_generation_not_an_error() -> None:
    """vLLM's 400 for a prompt past ``max_model_len``: that prompt gets finish_reason over_long, the
    others their replies, no retry; any other 400 still stops at once."""
    overflow = {
        "object": "error",
        "message": "This model's maximum context length is 2048 tokens. However, you requested 9000 tokens.",
    }

    def reply(body: dict[str, Any], n: int) -> Reply:
        return Reply(status=400, payload=overflow) if "huge" in user_text(body) else Reply(content="ok")

    with FakeChatServer(reply) as server:
        gen, slept = make(server)
        out = gen.generate(["small", "huge", "small"], max_tokens=4)
        assert [g.finish_reason for g in out] == ["stop", "over_long", "stop"] and out[1].text == "" and not slept
    with FakeChatServer(lambda body, n: Reply(status=400, payload={"message": "unknown model"})) as server:
        gen, _ = make(server)
        with pytest.raises(ServedError, match="HTTP 400"):
            gen.generate(["x"], max_tokens=4)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, '{"message": "This model\'s maximum context length is 2048 tokens"}', True),
        (400, '{"error": {"code": "context_length_exceeded"}}', True),
        (400, "The input (9000 tokens) is longer than the model's context length (2048 tokens).", True),
        (400, "unknown model m", False),
        (500, "maximum context length", False),
    ],
)
def test_context_overflow_reads_the_servers_wording(status: int, body: str, expected: bool) -> None:
    from prorag.models.served import context_overflow

    assert context_overflow(status, body) is expected
