"""HTTP retrieval server in the Search-R1 wire format.

``POST /retrieve`` with ``{"queries": [...], "topk": 3, "return_scores": true}`` (plus our
optional ``"partitions"``, one entry per query, ``null`` for the whole corpus) answers
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}``; with
``"return_scores": false`` each item is only the document, as Search-R1's server does.
``GET /health`` answers ``{"status": "ok", "num_passages": n}``.

The request is validated by hand rather than by a pydantic model, so that each kind of bad
request gets its own status and a one-line message: 400 for a body that is not JSON (or is
nested too deeply for the parser), 413 for a body over ``max_body_bytes`` or a batch over
``max_batch``, 422 for anything else wrong. An oversized body, chunked or not, is read on and
dropped (up to :data:`DRAIN_BYTES` more) before the 413, since a client sends its whole body
before it reads the answer: one that sees the connection closed mid-send gets a reset, not the
413. A client that goes away mid-body is logged as one line. The search itself runs in
Starlette's threadpool, so a long batch never blocks the event loop (and /health answers
meanwhile); the response is serialised with plain ``json`` (no ``jsonable_encoder`` pass over
every hit).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from prorag.retrieval.base import Hit, Retriever
from prorag.retrieval.partitions import UnknownPartitionError

log = logging.getLogger(__name__)

#: Default cap on a request body: 1 MiB holds a full batch of ordinary queries many times over.
MAX_BODY_BYTES = 1 << 20
#: Past the cap, up to this many more bytes of a body are read and dropped so that its client gets
#: the 413; a longer body is cut off (the connection closes).
DRAIN_BYTES = 64 << 20


class BadRequest(Exception):
    """A request the server refuses, with the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class SearchRequest:
    queries: list[str]
    topk: int
    return_scores: bool
    partitions: list[str | None] | None


def parse_request(body: bytes, *, max_batch: int, max_topk: int) -> SearchRequest:
    """Validate a ``/retrieve`` body; raise :class:`BadRequest` with the status to answer."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(400, "request body is not valid JSON") from None
    except RecursionError:  # e.g. [[[[...]]]]: the parser's recursion limit, not a server fault
        raise BadRequest(400, "request body is JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest(422, "request body must be a JSON object")
    queries = data.get("queries")
    if not isinstance(queries, list) or not queries:
        raise BadRequest(422, "'queries' must be a non-empty list of strings")
    if len(queries) > max_batch:
        raise BadRequest(413, f"{len(queries)} queries in one request; the most this server accepts is {max_batch}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise BadRequest(422, f"queries[{i}] must be a string, got {type(q).__name__}")
    topk = data.get("topk", 3)
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise BadRequest(422, f"'topk' must be an integer, got {topk!r}")
    if not 1 <= topk <= max_topk:
        raise BadRequest(422, f"'topk' must be between 1 and {max_topk}, got {topk}")
    return_scores = data.get("return_scores", True)
    if not isinstance(return_scores, bool):
        raise BadRequest(422, f"'return_scores' must be true or false, got {return_scores!r}")
    partitions = data.get("partitions")
    if partitions is not None:
        if not isinstance(partitions, list) or len(partitions) != len(queries):
            raise BadRequest(422, f"'partitions' must be a list with one entry (a string or null) per query ({len(queries)})")
        for i, p in enumerate(partitions):
            if p is not None and not isinstance(p, str):
                raise BadRequest(422, f"partitions[{i}] must be a string or null, got {type(p).__name__}")
    return SearchRequest(queries, topk, return_scores, partitions)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 once it is known to pass ``max_bytes``: from its
    ``Content-Length``, or while streaming a chunked body. Past the cap nothing more is kept (a huge
    body is never held in memory), but the rest is read and dropped, up to :data:`DRAIN_BYTES`, so
    that the client is done sending when the 413 comes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        refusal = f"request body of {int(declared)} bytes; the most this server accepts is {max_bytes}"
    else:
        refusal = None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            refusal = refusal or f"request body over {max_bytes} bytes, the most this server accepts"
            if size > max_bytes + DRAIN_BYTES:
                break
        elif refusal is None:
            chunks.append(chunk)
    if refusal is not None:
        raise BadRequest(413, refusal)
    return b"".join(chunks)


def render(results: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """The response body: wire hits, or only their documents when scores are not wanted."""
    if return_scores:
        return {"result": [[h.to_wire() for h in hits] for hits in results]}
    return {"result": [[h.to_wire()["document"] for h in hits] for hits in results]}


def create_app(
    retriever: Retriever, *, max_batch: int = 512, max_topk: int = 100, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """A FastAPI app serving ``retriever`` (see the module docstring for the protocol)."""
    app = FastAPI(title="prorag retriever", docs_url=None, redoc_url=None)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok", "num_passages": getattr(retriever, "num_passages", None)})

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        try:
            req = parse_request(await read_body(request, max_body_bytes), max_batch=max_batch, max_topk=max_topk)
            results = await run_in_threadpool(retriever.search, req.queries, req.topk, req.partitions)
        except ClientDisconnect:
            client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
            log.info("%s went away before sending its whole request body", client)
            return Response(status_code=400)  # nobody is left to read it
        except BadRequest as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except UnknownPartitionError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        return JSONResponse(render(results, req.return_scores))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("error while serving %s", request.url.path)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    return app


def _listening_socket(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` ourselves, so that the address logged is the one really bound (port 0 too).

    The socket is made with the protocol ``getaddrinfo`` names (``IPPROTO_TCP``), not 0:
    asyncio only sets ``TCP_NODELAY`` on accepted sockets whose protocol says TCP, and
    without it every keep-alive request waits ~40 ms on Nagle's algorithm and delayed ACKs.
    """
    family, type_, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def serve(
    index_dir: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 512,
    max_topk: int = 100,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Load the index at ``index_dir`` and serve it until interrupted.

    One search runs before the port opens, so that a dense encoder is loaded by the time
    ``/health`` answers. Access logging is off: a training run sends thousands of requests a
    minute. A port that cannot be bound, or is outside 0..65535 (0: a free port, the one bound
    is logged), is reported as a ``ValueError`` (one line from the CLI).
    """
    import uvicorn

    from prorag.retrieval.index import load_index

    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, got {port}")
    retriever = load_index(index_dir)
    app = create_app(retriever, max_batch=max_batch, max_topk=max_topk, max_body_bytes=max_body_bytes)
    retriever.search(["warm-up"], k=1)
    try:
        sock = _listening_socket(host, port)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    log.info(
        "serving %s (%s passages) on http://%s:%d/retrieve",
        index_dir,
        getattr(retriever, "num_passages", "?"),
        shown,
        bound_port,
    )
    config = uvicorn.Config(app, log_level="info", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
