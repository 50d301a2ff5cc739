"""A :class:`~prorag.retrieval.base.Retriever` that searches a retrieval server over HTTP.

Speaks the Search-R1 wire format (see :mod:`prorag.retrieval.server`), so it also works
against Search-R1's own server as long as no partition is asked for: ``"partitions"`` is
only sent when some query has one. Every shape of hit those servers answer with is read
(:meth:`~prorag.retrieval.base.Hit.from_wire`): wrapped with a score or not, with or without an id.

Failures are split by who can fix them. Connection errors, timeouts and 5xx answers are
the server's (busy, restarting): they are retried with exponential backoff and, when every
attempt failed, raised as :class:`RetrieverUnavailableError`. A 4xx answer is the caller's:
retrying cannot help, so it is raised at once as :class:`RetrieverRequestError` carrying the
server's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx

from prorag.core.errors import ServiceUnavailableError
from prorag.retrieval.base import Hit, check_search_args

# httpx logs every request at INFO: thousands a minute from a training run's rollouts.
logging.getLogger("httpx").setLevel(logging.WARNING)


class RetrieverRequestError(ValueError):
    """The server refused the request (4xx); ``message`` is the server's explanation."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"retrieval server refused the request ({status_code}): {message}")
        self.status_code = status_code
        self.message = message


class RetrieverUnavailableError(ServiceUnavailableError):
    """The server could not be reached, or kept failing, after every retry."""


def retrieve_url(url: str) -> str:
    """Accept the server's base URL or its ``/retrieve`` endpoint (Search-R1 configs use the latter)."""
    url = url.rstrip("/")
    return url if url.endswith("/retrieve") else f"{url}/retrieve"


class HttpRetriever:
    """Search a retrieval server; one persistent connection pool, big batches split up."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        batch_size: int = 64,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``retries`` extra attempts after the first, waiting ``backoff * 2**i`` seconds before
        retry ``i``; ``transport`` replaces the network (tests)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.url = retrieve_url(url)
        self.retries, self.backoff, self.batch_size = retries, backoff, batch_size
        self._client = httpx.Client(timeout=timeout, transport=transport)

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        """Top-``k`` hits of each query, sent ``batch_size`` queries per request."""
        parts = check_search_args(queries, k, partitions)
        queries = list(queries)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            end = start + self.batch_size
            results.extend(self._request(queries[start:end], k, parts[start:end]))
        return results

    def _request(self, queries: list[str], k: int, partitions: list[str | None]) -> list[list[Hit]]:
        payload: dict[str, Any] = {"queries": queries, "topk": k, "return_scores": True}
        if any(p is not None for p in partitions):
            payload["partitions"] = partitions
        response = self._post(payload)
        return _parse_result(response, len(queries))

    def _post(self, payload: dict[str, Any]) -> Any:
        """POST with retries (see the module docstring); return the decoded JSON body."""
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TransportError as e:  # connection refused/reset, timeouts
                failure = f"{type(e).__name__}: {e}"
                continue
            if response.status_code >= 500:
                failure = f"HTTP {response.status_code}: {_server_message(response)}"
                continue
            if response.status_code >= 400:
                raise RetrieverRequestError(response.status_code, _server_message(response))
            return response.json()
        raise RetrieverUnavailableError(f"retrieval server {self.url} failed {self.retries + 1} times; last: {failure}")

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _server_message(response: httpx.Response) -> str:
    """The ``error`` (ours) or ``detail`` (FastAPI's) of a JSON error body, else the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        for key in ("error", "detail"):
            if key in body:
                return str(body[key])
    return str(body)[:500]


def _parse_result(body: Any, n: int) -> list[list[Hit]]:
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != n:
        raise ValueError(f"malformed response from the retrieval server: expected 'result' with {n} lists of hits")
    try:
        return [[Hit.from_wire(item) for item in hits] for hits in result]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"malformed hit in the retrieval server's response: {e!r}") from None
