"""A local OpenAI-compatible chat-completions server for tests, scripted per request.

``FakeChatServer(behave)`` serves ``POST /v1/chat/completions`` and ``POST /v1/completions``
(with per-token log-probabilities when the request asks for them) on a free 127.0.0.1 port in a
thread (one thread per connection, so a slow reply does not hold up the others). ``behave(body, n)``
decides each reply, where ``n`` counts how many times this very body has been asked (1 on the
first request, 2 on its first retry, ...); the default gives a good thought. Every request is
recorded (body, headers, arrival time) and so is the most requests in flight at once. A reply may
also misbehave on the wire: stall after its headers (``stall``), or come chunked, without a
``Content-Length`` (``chunked``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.local_server import LocalServer

PROMPT_TOKENS = 11
COMPLETION_TOKENS = 7


@dataclass
class Reply:
    """One scripted reply: a thought (wrapped in the chat-completions schema), or a raw payload."""

    content: str | None = None
    status: int = 200
    payload: Any = None
    """Sent as is instead of the schema-wrapped ``content`` (malformed replies)."""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    finish_reason: str = "stop"
    tokens: list[str] | None = None
    """Tokens of ``content`` for a reply with log-probabilities (default: split before spaces)."""
    logprobs: list[float] | None = None
    """Their log-probabilities (default: ``-0.5`` each)."""
    stall: float = 0.0
    """Seconds of silence after the headers, before the body (a stalled server)."""
    chunked: bool = False
    """Send the body in 64 KiB chunks without a ``Content-Length`` (a streamed reply)."""

    def token_logprobs(self) -> tuple[list[str], list[float]]:
        tokens = self.tokens if self.tokens is not None else re.findall(r"\s*\S+", self.content or "")
        return tokens, self.logprobs if self.logprobs is not None else [-0.5] * len(tokens)


@dataclass
class Seen:
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    n: int
    path: str = "/v1/chat/completions"


def user_text(body: dict[str, Any]) -> str:
    """The prompt: the user message of a chat request, the ``prompt`` of a completions request."""
    if "prompt" in body:
        return body["prompt"]
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def good_thought(body: dict[str, Any]) -> str:
    """A valid thought, unique to the prompt (so a test can tell whose thought it is)."""
    tag = hashlib.sha1(user_text(body).encode()).hexdigest()[:8]
    return f"Teacher thought {tag}: this is the sensible next step."


def default_behave(body: dict[str, Any], n: int) -> Reply:
    return Reply(content=good_thought(body))


def completion_payload(reply: Reply, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """``reply`` in the chat-completions or completions schema, with log-probabilities if ``body`` asks."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": reply.finish_reason}
    tokens, logprobs = reply.token_logprobs()
    if chat:
        choice["message"] = {"role": "assistant", "content": reply.content}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, logprobs, strict=True)]}
    else:
        choice["text"] = reply.content
        choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs} if body.get("logprobs") else None
    return {
        "id": "cmpl-test",
        "object": "chat.completion" if chat else "text_completion",
        "model": body.get("model"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        },
    }


class FakeChatServer(LocalServer):
    def __init__(self, behave: Callable[[dict[str, Any], int], Reply] = default_behave) -> None:
        self.behave = behave
        self.seen: list[Seen] = []
        self.counts: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, {"error": {"message": "body is not JSON"}})
                    return
                key = hashlib.sha256(raw).hexdigest()
                with server._lock:
                    server.counts[key] += 1
                    n = server.counts[key]
                    server.seen.append(Seen(body, dict(self.headers), time.monotonic(), n, self.path))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    reply = server.behave(body, n)
                    if reply.delay:
                        time.sleep(reply.delay)
                    payload = reply.payload
                    if payload is None and reply.status == 200:
                        payload = completion_payload(reply, body, chat=self.path == "/v1/chat/completions")
                    elif payload is None:
                        payload = {"error": {"message": f"scripted {reply.status}"}}
                    self._send(reply.status, payload, reply.headers, stall=reply.stall, chunked=reply.chunked)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _send(
                self, status: int, payload: Any, headers: dict[str, str] | None = None, stall: float = 0.0, chunked: bool = False
            ) -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    if chunked:
                        self.send_header("Transfer-Encoding", "chunked")
                    else:
                        self.send_header("Content-Length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.flush()
                    if stall:
                        time.sleep(stall)
                    if not chunked:
                        self.wfile.write(data)
                        return
                    for start in range(0, len(data), 1 << 16):
                        piece = data[start : start + (1 << 16)]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    @property
    def n_requests(self) -> int:
        return len(self.seen)
