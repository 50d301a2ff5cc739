"""The retrieval server (a real process on a loopback port) and the HTTP client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prorag.retrieval.base import Hit
from prorag.retrieval.client import HttpRetriever, RetrieverRequestError, RetrieverUnavailableError
from prorag.retrieval.index import build_index, load_index, open_retriever

MAX_BATCH = 8
MAX_TOPK = 5
MAX_BODY = 64 * 1024
QUERIES = ["capital of Meldria", "capital of Meldria", "Eiffel tower", "", "the of", "river", "planet Jupiter"]
PARTS: list[str | None] = ["A", "B", None, None, "A", "B", None]


def free_port() -> int:
    """A port the OS just handed out (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def index_dir(mixed_corpus_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bm25-index")
    build_index(mixed_corpus_file, out)
    return out


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the server process's stdout and stderr go."""
    return tmp_path_factory.mktemp("server") / "server.log"


@pytest.fixture(scope="module")
def server(index_dir: Path, server_log: Path) -> Iterator[str]:
    """Base URL of a real ``prorag serve-retriever`` process, terminated at the end."""
    port = free_port()
    log_path = server_log
    log = log_path.open("wb")
    cmd = [sys.executable, "-m", "prorag.cli", "serve-retriever", "--index", str(index_dir),
           "--port", str(port), "--max-batch", str(MAX_BATCH), "--max-topk", str(MAX_TOPK),
           "--max-body-bytes", str(MAX_BODY)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not healthy after 60 s:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield url
        assert proc.poll() is None, f"server died during the tests:\n{log_path.read_text()}"
        assert f"127.0.0.1:{port}" in log_path.read_text()  # the bound address is logged
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_health(server: str) -> None:
    assert httpx.get(f"{server}/health").json() == {"status": "ok", "num_passages": 16}


def test_keep_alive_requests_are_not_delayed(server: str) -> None:
    """Without TCP_NODELAY on the server's sockets every keep-alive request waited ~40 ms."""
    with httpx.Client() as client:
        client.get(f"{server}/health")
        times = []
        for _ in range(15):
            start = time.perf_counter()
            client.post(f"{server}/retrieve", json={"queries": ["Eiffel"], "topk": 1})
            times.append(time.perf_counter() - start)
    assert sorted(times)[len(times) // 2] < 0.02


def test_client_results_equal_in_process(server: str, index_dir: Path) -> None:
    local = load_index(index_dir).search(QUERIES, k=3, partitions=PARTS)
    with HttpRetriever(server, batch_size=3) as remote:  # 7 queries: 3 requests
        assert remote.search(QUERIES, k=3, partitions=PARTS) == local
        assert remote.search(QUERIES[2:4], k=2) == load_index(index_dir).search(QUERIES[2:4], k=2)
        assert remote.search([], k=3) == []
    assert local[3] == [] and local[0] != local[1]


def test_open_retriever_accepts_urls(server: str) -> None:
    for spec in (server, f"{server}/retrieve", f"{server}/"):
        retriever = open_retriever(spec)
        assert isinstance(retriever, HttpRetriever)
        assert retriever.search(["Eiffel"], k=1)[0][0].title == "Eiffel Tower"
        retriever.close()


def test_raw_wire_format(server: str, index_dir: Path) -> None:
    body = {"queries": QUERIES[:3], "topk": 2, "return_scores": True, "partitions": PARTS[:3]}
    r = httpx.post(f"{server}/retrieve", json=body)
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 3
    assert set(result[0][0]) == {"document", "score"} and set(result[0][0]["document"]) == {"id", "contents"}
    local = load_index(index_dir).search(QUERIES[:3], k=2, partitions=PARTS[:3])
    assert [[Hit.from_wire(d) for d in hits] for hits in result] == local
    # Search-R1 sends no partitions and, without scores, gets bare documents.
    r = httpx.post(f"{server}/retrieve", json={"queries": ["Eiffel tower"], "topk": 1, "return_scores": False})
    assert r.json() == {"result": [[{"id": local[2][0].id, "contents": local[2][0].contents}]]}


BAD_REQUESTS: list[tuple[str, Any, int, str]] = [
    ("not json", b"{queries: nope", 400, "not valid JSON"),
    ("not an object", [1, 2], 422, "JSON object"),
    ("no queries", {"topk": 3}, 422, "queries"),
    ("queries not a list", {"queries": "who?"}, 422, "queries"),
    ("empty queries", {"queries": []}, 422, "queries"),
    ("non-string query", {"queries": ["ok", 3]}, 422, "queries[1]"),
    ("topk zero", {"queries": ["q"], "topk": 0}, 422, "topk"),
    ("topk too large", {"queries": ["q"], "topk": MAX_TOPK + 1}, 422, "topk"),
    ("topk not an int", {"queries": ["q"], "topk": "3"}, 422, "topk"),
    ("return_scores not a bool", {"queries": ["q"], "return_scores": "yes"}, 422, "return_scores"),
    ("batch too large", {"queries": ["q"] * (MAX_BATCH + 1)}, 413, str(MAX_BATCH)),
    ("partitions too short", {"queries": ["q", "r"], "partitions": ["A"]}, 422, "partitions"),
    ("partitions not a list", {"queries": ["q"], "partitions": "A"}, 422, "partitions"),
    ("partition not a string", {"queries": ["q"], "partitions": [7]}, 422, "partitions[0]"),
    ("unknown partition", {"queries": ["q"], "partitions": ["Atlantis"]}, 422, "Atlantis"),
]


@pytest.mark.parametrize(("name", "body", "status", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_4xx(server: str, name: str, body: Any, status: int, message: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server}/retrieve", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_deeply_nested_json_is_a_400_not_a_traceback(server: str) -> None:
    depth = 20_000  # 40 kB, under the body cap: the parser's recursion limit is what refuses it
    for body in ("[" * depth + "]" * depth, '{"queries": ' + "[" * depth + "]" * depth + "}"):
        r = httpx.post(f"{server}/retrieve", content=body.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json() == {"error": "request body is JSON nested too deeply"}
    assert httpx.get(f"{server}/health").status_code == 200


def test_body_over_the_cap_is_a_413(server: str) -> None:
    big = {"queries": ["who " * (5 * 1024 * 1024 // 4)]}  # a 5 MB query
    r = httpx.post(f"{server}/retrieve", json=big)
    assert r.status_code == 413, r.text
    assert str(MAX_BODY) in r.json()["error"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        yield b'{"queries": ["'
        for _ in range(2 * MAX_BODY // 1024):
            yield b"x" * 1024
        yield b'"]}'

    r = httpx.post(f"{server}/retrieve", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    just_under = {"queries": ["capital of Meldria " + "x" * (MAX_BODY - 100)]}
    assert httpx.post(f"{server}/retrieve", json=just_under).status_code == 200
    assert httpx.get(f"{server}/health").status_code == 200


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "content-length"])
def test_an_oversized_body_gets_its_413_even_when_the_client_closes_after_it(server: str, chunked: bool) -> None:
    """urllib sends ``Connection: close`` and its whole body before reading: the server used to
    close mid-body (a connection reset, no 413); it now reads on and drops the rest first."""
    body = b'{"queries": ["' + b"x" * (6 << 20) + b'"]}'
    data: Any = iter([body[i : i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    headers = {"Content-Type": "application/json", **({"Transfer-Encoding": "chunked"} if chunked else {})}
    request = urllib.request.Request(f"{server}/retrieve", data=data, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 413 and str(MAX_BODY) in json.loads(e.value.read())["error"]
    assert httpx.get(f"{server}/health").status_code == 200


def test_a_client_that_goes_away_mid_body_is_one_log_line(server: str, server_log: Path) -> None:
    """Not two ERROR tracebacks (the app's handler and uvicorn's) per client that gave up."""
    before = server_log.read_text()
    host, port = server.removeprefix("http://").split(":")
    for framing in (b"Content-Length: 1000\r\n\r\n" + b'{"queries": ["ab', b"Transfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n"):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing)
            time.sleep(0.2)
    deadline = time.monotonic() + 10
    while server_log.read_text()[len(before) :].count("went away") < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    new = server_log.read_text()[len(before) :]
    assert [line for line in new.splitlines() if line.strip()] == [
        line for line in new.splitlines() if "went away before sending its whole request body" in line
    ] and new.count("went away") == 2, new
    assert httpx.get(f"{server}/health").status_code == 200


def test_client_raises_on_4xx_with_the_server_message(server: str) -> None:
    with HttpRetriever(server, retries=3, backoff=10.0) as retriever:  # a retry would take 10 s
        start = time.monotonic()
        with pytest.raises(RetrieverRequestError, match="Atlantis") as err:
            retriever.search(["q"], k=1, partitions=["Atlantis"])
        assert err.value.status_code == 422
        with pytest.raises(RetrieverRequestError, match="topk"):
            retriever.search(["q"], k=MAX_TOPK + 1)
        assert time.monotonic() - start < 5


def test_server_still_alive(server: str) -> None:
    """Runs after the bad requests: none of them took the server down."""
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


# ----------------------------------------------------------------------------- client only


def ok_response(request: httpx.Request) -> httpx.Response:
    n = len(json.loads(request.content)["queries"])
    hit = Hit("p1", "Title\ntext", 1.5).to_wire()
    return httpx.Response(200, json={"result": [[hit]] * n})


class Flaky:
    """A stub server failing its first ``failures`` requests with ``failure``."""

    def __init__(self, failures: int, failure: Any) -> None:
        self.failures, self.failure, self.calls = failures, failure, 0
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.bodies.append(json.loads(request.content))
        if self.calls <= self.failures:
            if isinstance(self.failure, int):
                return httpx.Response(self.failure, json={"error": "busy"})
            raise self.failure("stub failure", request=request)
        return ok_response(request)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []
    monkeypatch.setattr("prorag.retrieval.client.time.sleep", waited.append)
    return waited


@pytest.mark.parametrize("failure", [503, 500, httpx.ConnectError, httpx.ReadTimeout])
def test_client_retries_with_exponential_backoff(failure: Any, sleeps: list[float]) -> None:
    stub = Flaky(2, failure)
    client = HttpRetriever("http://stub", retries=3, backoff=0.5, transport=httpx.MockTransport(stub))
    assert client.search(["q"], k=1) == [[Hit("p1", "Title\ntext", 1.5)]]
    assert stub.calls == 3
    assert sleeps == [0.5, 1.0]


def test_client_gives_up_after_its_retries(sleeps: list[float]) -> None:
    stub = Flaky(100, 503)
    client = HttpRetriever("http://stub", retries=2, backoff=0.1, transport=httpx.MockTransport(stub))
    with pytest.raises(RetrieverUnavailableError, match="503"):
        client.search(["q"], k=1)
    assert stub.calls == 3 and sleeps == [0.1, 0.2]


def test_client_does_not_retry_4xx(sleeps: list[float]) -> None:
    stub = Flaky(1, 422)
    client = HttpRetriever("http://stub", transport=httpx.MockTransport(stub))
    with pytest.raises(RetrieverRequestError, match="busy"):
        client.search(["q"], k=1)
    assert stub.calls == 1 and sleeps == []


def test_client_splits_batches_and_sends_partitions_only_when_used() -> None:
    stub = Flaky(0, 503)
    client = HttpRetriever("http://stub/retrieve", batch_size=2, transport=httpx.MockTransport(stub))
    assert len(client.search(["a", "b", "c", "d", "e"], k=2)) == 5
    assert [b["queries"] for b in stub.bodies] == [["a", "b"], ["c", "d"], ["e"]]
    assert all("partitions" not in b and b["topk"] == 2 for b in stub.bodies)
    stub.bodies.clear()
    client.search(["a", "b", "c", "d"], k=1, partitions=[None, None, None, "A"])
    assert [b.get("partitions") for b in stub.bodies] == [None, [None, "A"]]


def test_client_rejects_a_malformed_response() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"result": []}))
    with pytest.raises(ValueError, match="malformed"):
        HttpRetriever("http://stub", transport=transport).search(["q"], k=1)
