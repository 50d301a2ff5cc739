"""The served backend: any OpenAI-compatible completions or chat endpoint as a :class:`TextGenerator`.

A local vLLM or SGLang server, or a hosted API, generates for evaluation and the inference baselines.
:class:`ServedGenerator` sends a batch's prompts concurrently (at most ``concurrency`` in flight) and
returns one :class:`~prorag.models.generator.Generation` per prompt, in order, with token
log-probabilities when asked (FLARE needs them) and the server's token counts.

A request is bounded by ``connect_timeout_s``, ``read_timeout_s`` of silence once its reply has begun
(headers then nothing: a stalled server) and ``timeout_s`` in all; its reply is read as it streams and
refused past ``max_reply_bytes`` (:class:`ReplyTooLarge`, not retried). Timeouts, connection errors,
408, 429, 5xx and replies not of the schema are retried with capped exponential backoff and jitter
(honouring ``Retry-After``), one log line per retry, then fail as one ``ServiceUnavailableError``
naming the endpoint; a refusal naming the model's context length gives an empty generation
(``finish_reason`` ``over_long``, :func:`context_overflow`), as a local model's over-long prompt does;
any other status fails at once (:class:`ServedError`). Greedy replies are cached
on disk, sampled ones never. The key is read from the variable ``api_key_env`` names (``none``: no
key), never logged; plain http goes only to loopback unless ``allow_insecure_http``. The request
helpers (:func:`post`, :func:`retrying`, ...) also serve the LLM teacher's chat client.
"""

from __future__ import annotations

import dataclasses
import email.utils
import hashlib
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from prorag.core.errors import ServiceUnavailableError
from prorag.core.lazy_modules import lazy_module
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.models.endpoint_config import MAX_REPLY_BYTES, EndpointConfig, ServedConfig, is_safe_url, no_key_if_none
from prorag.models.generator import Generation, Sampling, TextGenerator, over_long_generation

if TYPE_CHECKING:
    import asyncio

    import httpx
else:
    asyncio = lazy_module("asyncio")  # 40 ms: imported by the first request, not for --help
    httpx = lazy_module("httpx")  # imported by the first request: --help stays fast

log = logging.getLogger(__name__)
# httpx logs every request at INFO ("HTTP Request: POST ... 200 OK", even for a reply that then
# stalls); the retry lines below say what matters.
logging.getLogger("httpx").setLevel(logging.WARNING)

T = TypeVar("T")


#: Statuses worth asking again: the server is busy, overloaded or broken for now.
RETRY_STATUSES = frozenset({408, 429})


# ----------------------------------------------------------------------------- shared request helpers


def request_key(body: Mapping[str, Any]) -> str:
    """Cache key of a request body: SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Wait before retry ``attempt`` (0-based): ``min(cap, base * 2**attempt)``, of which the
    second half is random ("equal jitter": never zero, spreads a burst of 429s)."""
    top = min(cap, base * 2**attempt)
    return top / 2 + rng.uniform(0, top / 2)


def token_count(value: Any) -> int:
    """A token count from a reply's ``usage`` (0 when absent or not a number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


#: What servers say when a prompt does not fit: vLLM and OpenAI ("maximum context length",
#: code ``context_length_exceeded``), SGLang ("longer than the model's context length").
_OVERFLOW_MARKERS = ("maximum context length", "context_length_exceeded", "context length")


def context_overflow(status: int, body: str) -> bool:
    """Whether a refusal says the prompt is longer than the model's context: HTTP 400 (or 413)
    naming the context length. Such a prompt gets :func:`~prorag.models.generator.over_long_generation`
    (counted by the evaluation), as on a local model, instead of ending the run."""
    return status in (400, 413) and any(marker in body.lower() for marker in _OVERFLOW_MARKERS)


class ServedError(ValueError):
    """The server refused a request in a way asking again cannot fix (bad key, unknown model, a
    prompt over the context): the run stops."""


class ReplyTooLarge(ServiceUnavailableError):
    """A reply over ``max_reply_bytes``: a server gone wrong (or a cap set too low), not a passing
    fault, so it is not asked again; the served generator's run stops, the teacher drops the thought."""


# ----------------------------------------------------------------------------- replies


class MalformedReply(Exception):
    """A 200 reply that is not JSON or not of the endpoint's schema (retried like a 5xx)."""


def _first_choice(payload: Any) -> dict[str, Any]:
    try:
        choice = payload["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise MalformedReply("no choices[0]") from None
    if not isinstance(choice, dict):
        raise MalformedReply("choices[0] is not an object")
    return choice


def _checked_logprobs(tokens: Any, logprobs: Any) -> tuple[list[str], list[float]]:
    """Tokens and their log-probabilities, checked to be parallel lists of strings and numbers."""
    if not isinstance(tokens, list) or not isinstance(logprobs, list) or len(tokens) != len(logprobs):
        raise MalformedReply("no token log-probabilities (tokens and logprobs must be lists of one length)")
    if not all(isinstance(t, str) for t in tokens):
        raise MalformedReply("a token is not a string")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in logprobs):
        raise MalformedReply("a token log-probability is not a number")
    return tokens, [float(x) for x in logprobs]


def parse_reply(payload: Any, *, api: Literal["completions", "chat"], logprobs: bool) -> Generation:
    """The :class:`Generation` in a completions or chat-completions reply; :class:`MalformedReply` if
    it has no text, or no per-token log-probabilities when they were asked for.

    Completions carry the text in ``choices[0].text`` and log-probs in
    ``choices[0].logprobs.{tokens,token_logprobs}``; chat carries ``choices[0].message.content``
    and ``choices[0].logprobs.content[*].{token,logprob}``. Token counts come from ``usage``
    (0 where a server leaves it out).
    """
    choice = _first_choice(payload)
    block = choice.get("logprobs")
    if api == "completions":
        text = choice.get("text")
        pairs = (block.get("tokens"), block.get("token_logprobs")) if isinstance(block, dict) else (None, None)
    else:
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        entries = block.get("content") if isinstance(block, dict) else None
        if isinstance(entries, list) and all(isinstance(e, dict) for e in entries):
            pairs = ([e.get("token") for e in entries], [e.get("logprob") for e in entries])
        else:
            pairs = (None, None)
    if not isinstance(text, str):
        raise MalformedReply("no text in choices[0]")
    tokens, token_logprobs = _checked_logprobs(*pairs) if logprobs else (None, None)
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    finish = choice.get("finish_reason")
    return Generation(
        text=text,
        token_logprobs=token_logprobs,
        tokens=tokens,
        prompt_tokens=token_count(usage.get("prompt_tokens")),
        completion_tokens=token_count(usage.get("completion_tokens")),
        finish_reason=finish if isinstance(finish, str) else "stop",
    )


# ----------------------------------------------------------------------------- the generator


@dataclass
class RequestCounts:
    """What a client of an endpoint did: requests (retries included), cache hits, billed tokens, errors."""

    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    """Billed: replies from the server only (a cached reply's counts stay on its Generation)."""
    completion_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    """Failed attempts by kind (``timeout``, ``connection``, ``http 503``, ``malformed``)."""


@dataclass
class ServedUsage(RequestCounts):
    """What the generator did (:class:`RequestCounts`), printable in one line."""

    def describe(self) -> str:
        line = (
            f"served: {self.requests} requests, {self.retries} retries, {self.cache_hits} cache hits, "
            f"{self.prompt_tokens} prompt + {self.completion_tokens} completion tokens"
        )
        if self.errors:
            line += "; failed attempts: " + ", ".join(f"{n} {e}" for e, n in sorted(self.errors.items()))
        return line


class Retry(Exception):
    """One failed attempt worth repeating: its kind (counted in ``errors``; None when the caller
    counted it elsewhere), what went wrong, and the server's ``Retry-After`` if it gave one."""

    def __init__(self, kind: str | None, detail: str, wait: float | None = None) -> None:
        super().__init__(detail)
        self.kind, self.detail, self.wait = kind, detail, wait


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    config: EndpointConfig,
    counts: RequestCounts,
    *,
    url: str,
    sleep: Callable[[float], Awaitable[Any]],
    rng: random.Random,
) -> T:
    """``attempt()``'s result, asked again after each :class:`Retry` it raises, with backoff
    (:func:`backoff_delay`, or the server's ``Retry-After`` capped at ``max_retry_after_s``); after
    ``max_retries`` retries :class:`~prorag.core.errors.ServiceUnavailableError` naming ``url`` and the
    last error. Each retry is logged as one line (:func:`retry_line`): a warning for a failed request,
    info for a reply the caller rejected (``kind`` None). The one retry loop of every endpoint client
    (served generator, LLM teacher and judge)."""
    last, delay = "", 0.0
    attempts = config.max_retries + 1
    for n in range(attempts):
        if n:
            counts.retries += 1
            await sleep(delay)
        delay = backoff_delay(n, config.backoff_base_s, config.backoff_max_s, rng)
        try:
            return await attempt()
        except Retry as r:
            if r.kind is not None:
                counts.errors[r.kind] += 1
            last = r.detail
            if r.wait is not None:
                delay = min(r.wait, config.max_retry_after_s)
            if n + 1 < attempts:
                log.log(logging.WARNING if r.kind else logging.INFO, "%s", retry_line(url, r.detail, n + 1, attempts, delay))
    raise ServiceUnavailableError(f"{url}: no valid reply after {attempts} attempts; last error: {last}")


def retry_line(url: str, detail: str, attempt: int, attempts: int, delay: float) -> str:
    """The line a retry is logged as: the endpoint, what failed, which attempt of how many, the wait."""
    return f"{url}: attempt {attempt} of {attempts} failed ({detail}); retrying in {delay:.1f} s"


async def post(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], *, config: EndpointConfig, redact: Callable[[str], str]
) -> httpx.Response:
    """POST ``body`` and read the whole reply within ``config``'s timeouts and size cap (see
    :class:`EndpointConfig`); timeouts and connection errors become :class:`Retry` (the key
    ``redact``ed away), a reply over ``max_reply_bytes`` :class:`ReplyTooLarge`.

    ``timeout_s`` is a deadline for the whole request (httpx's own timeouts are per operation, so
    a server that trickles would never trip them); the body is read chunk by chunk, each within
    ``read_timeout_s``. The reply is returned read, its content already decoded."""
    timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
    try:
        async with asyncio.timeout(config.timeout_s):
            async with http.stream("POST", url, json=body, timeout=timeout) as resp:
                content = await _read_capped(resp, url, config)
    except TimeoutError:
        raise Retry("timeout", f"no complete reply within {config.timeout_s:g} s (timeout_s)") from None
    except httpx.ConnectTimeout:
        raise Retry("timeout", f"could not connect within {config.connect_timeout_s:g} s (connect_timeout_s)") from None
    except httpx.TimeoutException:
        raise Retry("timeout", f"timed out after {config.timeout_s:g} s") from None
    except httpx.TransportError as e:
        raise Retry("connection", f"connection error: {redact(str(e)) or type(e).__name__}") from None
    # The content is decoded: the headers that described its encoding on the wire would decode it again.
    headers = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in ("content-encoding", "content-length")]
    return httpx.Response(resp.status_code, headers=headers, content=content, request=resp.request)


async def _read_capped(resp: httpx.Response, url: str, config: EndpointConfig) -> bytes:
    """The body of ``resp``, refused as soon as it is known to pass ``max_reply_bytes`` (from its
    ``Content-Length``, or while it streams, so a huge reply is never held whole); :class:`Retry`
    when the server falls silent for ``read_timeout_s`` after its headers."""
    cap = config.max_reply_bytes
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise _too_large(url, f"a reply of {int(declared)} bytes is over max_reply_bytes ({cap})")
    chunks: list[bytes] = []
    size = 0
    stream = resp.aiter_bytes()
    while True:
        try:
            chunk = await asyncio.wait_for(anext(stream), config.read_timeout_s)
        except StopAsyncIteration:
            return b"".join(chunks)
        except TimeoutError:
            raise Retry(
                "timeout", f"the reply stalled: nothing for {config.read_timeout_s:g} s after it began (read_timeout_s)"
            ) from None
        size += len(chunk)
        if size > cap:
            raise _too_large(url, f"the reply grew past max_reply_bytes ({cap}) as it was read")
        chunks.append(chunk)


def _too_large(url: str, what: str) -> ReplyTooLarge:
    return ReplyTooLarge(f"{url}: {what}; check the server (max_tokens, logprobs), or raise max_reply_bytes")


def api_key(env: str | None, error: type[Exception]) -> str | None:
    """The key in environment variable ``env``; None when no key is needed (``env`` unset, empty or
    ``none``). Named but not set: ``error`` now, before any request (a request without it would only
    come back 401)."""
    env = no_key_if_none(env)
    if env is None:
        return None
    key = os.environ.get(env)
    if not key:
        raise error(
            f"environment variable {env} (api_key_env) is not set: export the API key, or set api_key_env: null "
            "for a server that needs none"
        )
    return key


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, in a worker thread when this thread
    already runs an event loop (a notebook), where :func:`asyncio.run` would refuse."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ServedGenerator(TextGenerator):
    """A :class:`~prorag.models.generator.TextGenerator` on an OpenAI-compatible server (module docstring).

    Greedy replies (temperature 0) are cached in a JSONL file (``cache_path``) keyed by the SHA-256 of
    the request body (model, prompt or messages, sampling settings; not the key or URL), appended with a
    flush per reply, so a rerun or a resumed evaluation does not pay twice; identical greedy requests of
    one batch go out once. A key that is named but not set is an error before any request.
    ``usage`` accumulates over calls; ``sleep`` and ``rng`` are for tests (instant, seeded backoff).
    """

    def __init__(
        self,
        config: ServedConfig,
        *,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.usage = ServedUsage()
        self._sleep = sleep or asyncio.sleep  # None: the real one
        self._rng = rng or random.Random()
        self._key = api_key(config.api_key_env, ServedError)
        self._cache: dict[str, Generation] = {}
        if config.cache_path and Path(config.cache_path).is_file():
            for row in read_jsonl(config.cache_path, tolerate_truncated_tail=True):
                reply = row.get("reply")
                if isinstance(row.get("key"), str) and isinstance(reply, dict):
                    try:
                        self._cache[row["key"]] = Generation(**reply)
                    except TypeError:
                        continue  # a row of another version: asked again
            log.info("served reply cache %s: %d replies", config.cache_path, len(self._cache))

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def body(self, prompt: str, sampling: Sampling) -> dict[str, Any]:
        """The request body of one prompt (also what the cache key hashes)."""
        c = self.config
        body: dict[str, Any] = {"model": c.model, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature}
        if c.api == "completions":
            body["prompt"] = prompt
        else:
            system = [{"role": "system", "content": c.system_prompt}] if c.system_prompt else []
            body["messages"] = [*system, {"role": "user", "content": prompt}]
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.logprobs:
            body["logprobs"] = 1 if c.api == "completions" else True
        return body

    def complete(self, prompts: Sequence[str], sampling: Sampling) -> list[Generation]:
        """One :class:`Generation` per prompt, in order (all requests concurrent, see :meth:`acomplete`)."""
        return run_sync(self.acomplete(prompts, sampling))

    async def acomplete(self, prompts: Sequence[str], sampling: Sampling) -> list[Generation]:
        """:meth:`complete` in a running event loop. The first request that fails for good cancels
        the others and is raised (:class:`ServedError` or :class:`ServiceUnavailableError`)."""
        temperature = sampling.temperature
        c = self.config
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        limits = httpx.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency)
        appender = JsonlAppender(c.cache_path) if c.cache_path and temperature == 0 else None
        sem = asyncio.Semaphore(c.concurrency)
        jobs: dict[str, asyncio.Task[Generation]] = {}
        order: list[str] = []
        try:
            async with httpx.AsyncClient(limits=limits, headers=headers) as http:  # timeouts: per request (post)
                async with asyncio.TaskGroup() as tg:
                    for i, prompt in enumerate(prompts):
                        body = self.body(prompt, sampling)
                        key = request_key(body)
                        slot = key if temperature == 0 else f"{key}#{i}"  # identical greedy requests go out once
                        if slot not in jobs:
                            jobs[slot] = tg.create_task(self._request(http, sem, body, key, appender))
                        order.append(slot)
        except ExceptionGroup as group:
            raise group.exceptions[0] from None
        finally:
            if appender is not None:
                appender.close()
        return [dataclasses.replace(jobs[slot].result()) for slot in order]

    async def _request(
        self,
        http: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        body: dict[str, Any],
        key: str,
        appender: JsonlAppender | None,
    ) -> Generation:
        """One request's reply: from the cache (greedy only), else from the server with retries."""
        c, usage = self.config, self.usage
        greedy = body["temperature"] == 0
        if greedy and key in self._cache:
            usage.cache_hits += 1
            return self._cache[key]

        async def attempt() -> Generation:
            async with sem:
                usage.requests += 1
                return self._read(await self._post(http, body), logprobs="logprobs" in body)

        gen = await retrying(attempt, c, usage, url=c.url, sleep=self._sleep, rng=self._rng)
        usage.prompt_tokens += gen.prompt_tokens
        usage.completion_tokens += gen.completion_tokens
        if greedy:
            self._cache[key] = gen
            if appender is not None:
                appender.append({"key": key, "model": c.model, "reply": dataclasses.asdict(gen)})
        return gen

    async def _post(self, http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
        return await post(http, self.config.url, body, config=self.config, redact=self._redact)

    def _read(self, resp: httpx.Response, *, logprobs: bool) -> Generation:
        """The Generation in ``resp``; :class:`Retry` for a status or reply worth asking again,
        :class:`ServedError` for a status that will not change."""
        status = resp.status_code
        if status != 200:
            detail = self._redact(resp.text[:300]).replace("\n", " ")
            if context_overflow(status, resp.text[:2000]):
                log.warning(
                    "%s: a prompt over the model's context was refused (HTTP %d): an empty generation", self.config.url, status
                )
                return over_long_generation(0, logprobs)
            if status in RETRY_STATUSES or status >= 500:
                raise Retry(f"http {status}", f"HTTP {status}: {detail}", parse_retry_after(resp.headers.get("retry-after")))
            raise ServedError(
                f"{self.config.url}: HTTP {status} (check base_url, model and api_key_env; a prompt over the "
                f"model's context also ends here): {detail}"
            )
        try:
            return parse_reply(resp.json(), api=self.config.api, logprobs=logprobs)
        except ValueError:
            raise Retry("malformed", "the reply is not JSON") from None
        except (MalformedReply, AttributeError) as e:
            raise Retry("malformed", f"malformed reply: {e}") from None


__all__ = [
    "MAX_REPLY_BYTES",
    "context_overflow",
    "MalformedReply",
    "ReplyTooLarge",
    "RequestCounts",
    "Retry",
    "ServedConfig",
    "ServedError",
    "ServedGenerator",
    "ServedUsage",
    "api_key",
    "backoff_delay",
    "is_safe_url",
    "no_key_if_none",
    "parse_reply",
    "parse_retry_after",
    "post",
    "request_key",
    "retry_line",
    "retrying",
    "run_sync",
    "token_count",
]
