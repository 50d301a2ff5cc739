"""The LLM teacher: an OpenAI-compatible chat model writes the ``<step>`` thoughts of gold trajectories.

Stage 1's thoughts (docs/METHOD.md §2; GPT-4o in the paper) from any chat-completions server, handed to
:func:`prorag.agent.gold.render_gold` through :class:`PrecomputedTeacher`, so rendering stays in one place.
One request per thought, not per record: each prompt holds exactly what the policy has seen at that
point plus its next action, so no thought can peek at a later hop; replies are one checked line
(:func:`check_thought`), cached and retried per thought, and all run concurrently.

Robustness (the served client's retry loop, :func:`~prorag.models.served.retrying`): ``concurrency``
in-flight requests; exponential backoff with jitter on 429, 5xx, timeouts and connection errors
(honouring ``Retry-After``), and on malformed or truncated replies; after ``max_retries`` the
thought fails and its record is dropped. 401/403/404 stop the run (:class:`LLMTeacherError`).
Cache: JSONL keyed by the SHA-256 of the request body (not key or URL), re-checked on read. The
key comes from ``api_key_env`` at request time and is never logged, cached or shown.
:class:`LLMUsage` counts billed tokens and cost.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from prorag.agent.gold import Hop
from prorag.agent.schema import TAGS
from prorag.core.config import setting
from prorag.core.errors import ServiceUnavailableError
from prorag.core.lazy_modules import lazy_module
from prorag.core.metrics import normalize_answer
from prorag.core.setting_checks import check_temperature
from prorag.data.jsonl import JsonlAppender, read_jsonl
from prorag.data.records import Record
from prorag.models.endpoint_config import EndpointConfig
from prorag.models.served import RequestCounts, Retry, api_key, backoff_delay, parse_retry_after, post, request_key, retrying
from prorag.models.served import token_count as _count
from prorag.retrieval.base import Hit, format_documents

if TYPE_CHECKING:
    import asyncio

    import httpx
else:
    asyncio = lazy_module("asyncio")  # 40 ms: imported by the first request, not for --help
    httpx = lazy_module("httpx")  # imported by the first request: --help stays fast

log = logging.getLogger(__name__)

ThoughtKind = Literal["search", "conclude", "answer"]

#: Statuses that mean the configuration is wrong (key, model, URL): the run stops.
FATAL_STATUSES = (401, 403, 404)

#: A tag-like string in a thought, any case, spaces allowed (``< /step >``): the ten tags' names.
_TAG_LIKE = re.compile(r"<\s*/?\s*(?:" + "|".join(sorted({re.escape(t.strip("</>")) for t in TAGS})) + r")\s*>", re.IGNORECASE)


@dataclass
class LLMTeacherConfig(EndpointConfig):
    """Settings of the LLM teacher (``prorag sft-data --teacher llm``): the endpoint's (shared with the
    served generator, :class:`~prorag.models.endpoint_config.EndpointConfig`), with the defaults of a hosted
    chat API, and how thoughts are asked for, accepted and priced."""

    api_key_env: str | None = setting(
        "OPENAI_API_KEY",
        help="Environment variable holding the key (never the key itself: configs get shared); it must be set. "
        "None (YAML `null`) or empty: the server needs no key (a local server).",
    )
    concurrency: int = setting(8, help="Requests in flight at once.")
    backoff_base_s: float = setting(1.0, help="First retry waits about this long, doubling (with jitter) up to `backoff_max_s`.")
    backoff_max_s: float = setting(60.0, help="Longest wait between two retries.")
    max_retry_after_s: float = setting(300.0, help="Cap on a server's `Retry-After`.")
    timeout_s: float = setting(60.0, help="Seconds for one request as a whole, from connecting to the reply's last byte.")
    cache_path: str | None = setting(
        None, help="Reply cache (JSONL); `prorag sft-data` defaults it to `OUT.llm_cache.jsonl`. None: no cache."
    )
    temperature: float = setting(0.0, help="Sampling temperature of the model's replies, >= 0 (0: greedy).")
    max_tokens: int = setting(128, help="Completion tokens per reply; a reply cut by it is rejected (retried).")
    max_thought_chars: int = setting(400, help="Longest accepted thought, in characters.")
    price_input_per_1k: float | None = setting(None, help="Price of 1,000 prompt tokens, for the cost estimate (any currency).")
    price_output_per_1k: float | None = setting(None, help="Price of 1,000 completion tokens.")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_tokens", "max_thought_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"LLMTeacherConfig.{name} must be >= 1, got {getattr(self, name)}")
        check_temperature(self.temperature, "LLMTeacherConfig.temperature")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


class LLMTeacherError(ValueError):
    """A configuration error the server reports (bad key, unknown model, wrong URL): the run stops."""


# ----------------------------------------------------------------------------- thoughts for rendering


@dataclass
class RecordThoughts:
    """Every thought of one record's gold trajectory."""

    search: list[str]
    """Before each hop's search."""
    conclude: list[str]
    """After each hop's retrieval."""
    answer: str
    """Before the final answer."""


class PrecomputedTeacher:
    """A :class:`~prorag.agent.gold.Teacher` that returns thoughts written beforehand, by record id."""

    def __init__(self, thoughts: Mapping[str, RecordThoughts]) -> None:
        self.thoughts = thoughts

    def search_thought(self, record: Record, hops: Sequence[Hop], i: int) -> str:
        return self.thoughts[record.id].search[i]

    def conclude_thought(self, record: Record, hops: Sequence[Hop], i: int, hits: Sequence[Hit]) -> str:
        return self.thoughts[record.id].conclude[i]

    def answer_thought(self, record: Record, hops: Sequence[Hop]) -> str:
        return self.thoughts[record.id].answer


@dataclass
class TeacherItem:
    """What the teacher sees of one record: its gold hops and what the retriever returned for each."""

    record: Record
    hops: list[Hop]
    hits: list[list[Hit]]


# ----------------------------------------------------------------------------- prompts and checks

SYSTEM_PROMPT = (
    "You write the inner thoughts of a research assistant that answers a question by searching a "
    "document collection step by step. You are told what the assistant knows so far and what it does "
    "next; write the thought it has at that moment: one or two short first-person sentences, plain "
    "text on a single line, with no tags, markup, lists or quotation marks around it. Never mention "
    "anything the assistant has not seen yet. Reply with the thought only."
)


@dataclass
class ThoughtRequest:
    """One thought to ask for: which one, its chat messages, and what its check needs."""

    record_id: str
    kind: ThoughtKind
    hop: int
    """Hop index (search, conclude); -1 for the answer thought."""
    messages: list[dict[str, str]]
    withheld: str | None = None
    """A search thought must not state this (the hop's sub-answer, not yet searched for) unless
    the prompt already shows it."""
    shown: str = ""
    """The facts the prompt shows (for the leak check)."""


def _found_so_far(hops: Sequence[Hop], upto: int) -> str:
    if upto == 0:
        return "Found so far: nothing yet."
    lines = [f'- searched "{h.query}" and concluded: {h.answer}' for h in hops[:upto]]
    return "Found so far:\n" + "\n".join(lines)


def thought_requests(item: TeacherItem) -> list[ThoughtRequest]:
    """The ``2h + 1`` requests of one record, in trajectory order (search 0, conclude 0, ..., answer).

    The prompt of hop ``i`` is built from hops ``<= i`` only (see the module docstring).
    """
    record, hops = item.record, item.hops
    out: list[ThoughtRequest] = []

    def msgs(user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    for i, hop in enumerate(hops):
        known = _found_so_far(hops, i)
        search = (
            f"Question: {record.question}\n{known}\n"
            f'Next action: search for "{hop.query}" to find out: {hop.question}\n'
            "Write the thought the assistant has just before this search: what is still missing and why "
            "this search comes next. The result of the search is not known yet: do not guess it."
        )
        shown = " ".join([record.question, hop.question, hop.query, *(f"{h.query} {h.answer}" for h in hops[:i])])
        out.append(ThoughtRequest(record.id, "search", i, msgs(search), withheld=hop.answer, shown=shown))
        docs = format_documents(item.hits[i]) if item.hits[i] else "(no documents)"
        conclude = (
            f"Question: {record.question}\n{known}\n"
            f'The assistant searched "{hop.query}" to find out: {hop.question}\n'
            f"The search returned:\n{docs}\n"
            f'Next action: conclude "{hop.answer}".\n'
            "Write the thought that leads from these documents to this conclusion, naming the document "
            "that states it; if none states it, say that the documents do not state it directly."
        )
        out.append(ThoughtRequest(record.id, "conclude", i, msgs(conclude)))
    answer = (
        f"Question: {record.question}\n{_found_so_far(hops, len(hops))}\n"
        f'Next action: give the final answer "{record.golden_answers[0]}".\n'
        "Write the thought that combines these findings into the final answer."
    )
    out.append(ThoughtRequest(record.id, "answer", -1, msgs(answer)))
    return out


def check_thought(text: str, *, max_chars: int, withheld: str | None = None, shown: str = "") -> str | None:
    """Why ``text`` cannot be a thought, or None if it can.

    A thought is non-empty, one line after stripping, at most ``max_chars`` characters, holds no
    ProRAG tag (nor a tag-like ``< /step >``: the trajectory would not parse), and a search thought
    does not state the sub-answer it is about to search for (``withheld``, SQuAD-normalised,
    whole words) unless the prompt already showed it (``shown``).
    """
    t = text.strip()
    if not t:
        return "empty"
    if "\n" in t or "\r" in t:
        return "several lines"
    if len(t) > max_chars:
        return "too long"
    if _TAG_LIKE.search(t):
        return "contains a tag"
    if withheld:
        w = normalize_answer(withheld)
        if len(w) >= 2 and f" {w} " in f" {normalize_answer(t)} " and f" {w} " not in f" {normalize_answer(shown)} ":
            return "states the sub-answer before searching"
    return None


# ----------------------------------------------------------------------------- usage


@dataclass
class LLMUsage(RequestCounts):
    """What the teacher did: the endpoint's counts (:class:`~prorag.models.served.RequestCounts`: HTTP
    requests with retries, cache hits, billed tokens of every reply, failed requests by kind), and
    thoughts obtained, failed and rejected."""

    thoughts: int = 0
    """Thoughts obtained (from the cache or the server)."""
    failed_thoughts: int = 0
    """Thoughts with no acceptable reply after every retry."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Replies rejected, by reason (malformed, cut, :func:`check_thought`'s reasons)."""

    def cost(self, config: LLMTeacherConfig) -> float | None:
        """Estimated cost from the token counts and the configured prices (None without prices)."""
        if config.price_input_per_1k is None and config.price_output_per_1k is None:
            return None
        return (
            self.prompt_tokens * (config.price_input_per_1k or 0.0) + self.completion_tokens * (config.price_output_per_1k or 0.0)
        ) / 1000

    def describe(self, config: LLMTeacherConfig) -> str:
        lines = [
            f"LLM teacher {config.model}: {self.thoughts} thoughts ({self.cache_hits} from the cache), "
            f"{self.requests} requests, {self.retries} retries, {self.failed_thoughts} thoughts failed",
            f"  tokens: {self.prompt_tokens} prompt + {self.completion_tokens} completion",
        ]
        cost = self.cost(config)
        lines.append(f"  estimated cost: {cost:.4f}" if cost is not None else "  estimated cost: n/a (no prices configured)")
        if self.rejected:
            lines.append("  rejected replies: " + ", ".join(f"{n} {r}" for r, n in sorted(self.rejected.items())))
        if self.errors:
            lines.append("  failed requests: " + ", ".join(f"{n} {e}" for e, n in sorted(self.errors.items())))
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the client


def _content(payload: Any) -> tuple[str | None, str | None]:
    """``(content, finish_reason)`` of a chat-completions reply, or ``(None, None)`` if malformed."""
    try:
        choice = payload["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None, None
    if not isinstance(content, str):
        return None, None
    return content, choice.get("finish_reason") if isinstance(choice, dict) else None


class _GiveUp(Exception):
    """A status that asking again cannot fix, short of a fatal one: this reply fails."""


class ChatClient:
    """Chat completions with a concurrency limit, retries, a validating reply cache and usage counts.

    Use inside ``async with client:`` (opens the HTTP connection pool and the cache file); the
    cache and the counts outlive the block, so one client serves several blocks in a row.
    """

    def __init__(
        self,
        config: LLMTeacherConfig,
        *,
        usage: LLMUsage | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.usage = usage or LLMUsage()
        self._sleep = sleep or asyncio.sleep  # None: the real one
        self._rng = rng or random.Random()
        self._cache: dict[str, str] = {}
        if config.cache_path and Path(config.cache_path).is_file():
            for row in read_jsonl(config.cache_path, tolerate_truncated_tail=True):
                if isinstance(row.get("key"), str) and isinstance(row.get("content"), str):
                    self._cache[row["key"]] = row["content"]
            log.info("LLM reply cache %s: %d replies", config.cache_path, len(self._cache))
        self._http: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        self._appender: JsonlAppender | None = None
        self._key()  # a needed key that is not set fails here, before any work

    def _key(self) -> str | None:
        """The API key from ``api_key_env``, read at each use (:func:`~prorag.models.served.api_key`)."""
        return api_key(self.config.api_key_env, LLMTeacherError)

    def _headers(self) -> dict[str, str]:
        key = self._key()
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _redact(self, text: str) -> str:
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        return text.replace(key, "***") if key else text

    async def __aenter__(self) -> ChatClient:
        limits = httpx.Limits(max_connections=self.config.concurrency, max_keepalive_connections=self.config.concurrency)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.config.timeout_s), limits=limits, headers=self._headers())
        self._sem = asyncio.Semaphore(self.config.concurrency)
        if self.config.cache_path:
            self._appender = JsonlAppender(self.config.cache_path)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
        if self._appender is not None:
            self._appender.close()
        self._http = self._sem = self._appender = None

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The request body (also what the cache key hashes)."""
        c = self.config
        return {"model": c.model, "messages": messages, "temperature": c.temperature, "max_tokens": c.max_tokens}

    async def complete(self, messages: list[dict[str, str]], check: Callable[[str], str | None]) -> str | None:
        """The stripped reply to ``messages`` that ``check`` accepts (returns None), from the cache
        or the server; None once ``max_retries`` retries are spent. Raises
        :class:`LLMTeacherError` on a fatal status (401, 403, 404)."""
        if self._http is None or self._sem is None:
            raise RuntimeError("ChatClient.complete needs `async with client:`")
        c, usage = self.config, self.usage
        body = self.body(messages)
        key = request_key(body)
        cached = self._cache.get(key)
        if cached is not None and check(cached) is None:
            usage.cache_hits += 1
            usage.thoughts += 1
            return cached.strip()
        http, sem = self._http, self._sem

        def reject(reason: str) -> NoReturn:
            usage.rejected[reason] += 1
            raise Retry(None, reason)  # counted as a rejection, not a failed request

        async def attempt() -> str:
            async with sem:
                usage.requests += 1
                resp = await post(http, c.url, body, config=c, redact=self._redact)
            status = resp.status_code
            if status in FATAL_STATUSES:
                detail = self._redact(resp.text[:300]).replace("\n", " ")
                raise LLMTeacherError(f"{c.url}: HTTP {status} (check --base-url, --model and ${c.api_key_env}): {detail}")
            if status != 200:
                if status == 429 or status >= 500:
                    raise Retry(f"http {status}", f"HTTP {status}", parse_retry_after(resp.headers.get("retry-after")))
                usage.errors[f"http {status}"] += 1
                raise _GiveUp  # another 4xx: this request will not succeed by asking again
            try:
                payload = resp.json()
            except ValueError:
                payload = None
            if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
                usage.prompt_tokens += _count(payload["usage"].get("prompt_tokens"))
                usage.completion_tokens += _count(payload["usage"].get("completion_tokens"))
            content, finish = _content(payload)
            if content is None:
                reject("malformed reply")
            if finish == "length":
                reject("cut by max_tokens")
            reason = check(content)
            if reason is not None:
                reject(reason)
            return content.strip()

        try:
            content = await retrying(attempt, c, usage, url=c.url, sleep=self._sleep, rng=self._rng)
        except (ServiceUnavailableError, _GiveUp):
            usage.failed_thoughts += 1
            return None
        self._cache[key] = content
        if self._appender is not None:
            self._appender.append({"key": key, "model": c.model, "content": content})
        usage.thoughts += 1
        return content


class LLMTeacher:
    """Writes every thought of gold trajectories with a chat model (see the module docstring).

    :meth:`write_thoughts` returns, per record id, its :class:`RecordThoughts`, or None when one
    of its thoughts failed (the record is to be dropped). ``usage`` accumulates over calls.
    """

    def __init__(self, config: LLMTeacherConfig, **client_kwargs: Any) -> None:
        self.config = config
        self.client = ChatClient(config, **client_kwargs)

    @property
    def usage(self) -> LLMUsage:
        return self.client.usage

    def write_thoughts(self, items: Sequence[TeacherItem]) -> dict[str, RecordThoughts | None]:
        """Synchronous :meth:`awrite_thoughts` (runs its own event loop)."""
        return asyncio.run(self.awrite_thoughts(items))

    async def awrite_thoughts(self, items: Sequence[TeacherItem]) -> dict[str, RecordThoughts | None]:
        requests = [r for item in items for r in thought_requests(item)]
        max_chars = self.config.max_thought_chars
        async with self.client:
            try:
                async with asyncio.TaskGroup() as tg:  # a fatal error cancels the other requests
                    tasks = [
                        tg.create_task(
                            self.client.complete(
                                r.messages,
                                lambda text, r=r: check_thought(text, max_chars=max_chars, withheld=r.withheld, shown=r.shown),
                            )
                        )
                        for r in requests
                    ]
            except ExceptionGroup as group:
                fatal = [e for e in group.exceptions if isinstance(e, LLMTeacherError)]
                if fatal:
                    raise fatal[0] from None
                raise
        got: dict[str, list[tuple[ThoughtRequest, str | None]]] = {}
        for r, t in zip(requests, tasks, strict=True):
            got.setdefault(r.record_id, []).append((r, t.result()))
        out: dict[str, RecordThoughts | None] = {}
        for item in items:
            pairs = got.get(item.record.id, [])
            if any(text is None for _, text in pairs):
                out[item.record.id] = None
                continue
            out[item.record.id] = RecordThoughts(
                search=[text for r, text in pairs if r.kind == "search"],  # type: ignore[misc]
                conclude=[text for r, text in pairs if r.kind == "conclude"],  # type: ignore[misc]
                answer=next(text for r, text in pairs if r.kind == "answer"),  # type: ignore[misc]
            )
        return out


__all__ = [
    "ChatClient",
    "LLMTeacher",
    "LLMTeacherConfig",
    "LLMTeacherError",
    "LLMUsage",
    "PrecomputedTeacher",
    "RecordThoughts",
    "SYSTEM_PROMPT",
    "TeacherItem",
    "ThoughtRequest",
    "backoff_delay",
    "check_thought",
    "parse_retry_after",
    "request_key",
    "thought_requests",
]
