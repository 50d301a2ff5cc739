"""The HTTP client reads every answer shape Search-R1's retrieval servers send (search_r1/search/*_server.py).

Each shape below is what one of its servers puts in ``{"result": [[...], ...]}`` for one hit: the
dense and BM25 servers with ``return_scores`` true and false (the document unwrapped), BM25 over a
Lucene index storing contents (no id), the rerank server (the document a string) and the web-search
servers (``{"contents"}`` alone, no score).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from prorag.data.records import passage_id
from prorag.retrieval.base import Hit
from prorag.retrieval.client import HttpRetriever

CONTENTS = '"Aaron"\nAaron is a prophet, high priest, and the brother of Moses.'
HASH_ID = passage_id('"Aaron"', "Aaron is a prophet, high priest, and the brother of Moses.")

SHAPES: list[tuple[str, Any, Hit]] = [
    ("dense, return_scores true", {"document": {"id": "12", "contents": CONTENTS}, "score": 0.83}, Hit("12", CONTENTS, 0.83)),
    ("dense, return_scores false", {"id": 12, "contents": CONTENTS}, Hit("12", CONTENTS, 0.0)),
    (
        "bm25 stored contents, return_scores false",
        {"title": "Aaron", "text": "Aaron is a prophet, high priest, and the brother of Moses.", "contents": CONTENTS},
        Hit(HASH_ID, CONTENTS, 0.0),
    ),
    (
        "bm25 stored contents, return_scores true",
        {"document": {"title": "Aaron", "text": "x", "contents": CONTENTS}, "score": 7.5},
        Hit(HASH_ID, CONTENTS, 7.5),
    ),
    ("rerank, return_scores true", {"document": CONTENTS, "score": 0.9}, Hit(HASH_ID, CONTENTS, 0.9)),
    ("rerank, return_scores false", CONTENTS, Hit(HASH_ID, CONTENTS, 0.0)),
    ("web search", {"document": {"contents": CONTENTS}}, Hit(HASH_ID, CONTENTS, 0.0)),
    ("title and text only", {"id": "t", "title": "Aaron", "text": "a prophet"}, Hit("t", "Aaron\na prophet", 0.0)),
]


@pytest.mark.parametrize(("shape", "item", "hit"), SHAPES, ids=[s for s, _, _ in SHAPES])
def test_the_client_reads_the_shape(shape: str, item: Any, hit: Hit) -> None:
    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(200, json={"result": [[item] * body["topk"] for _ in body["queries"]]})

    with HttpRetriever("http://searchr1:8000/retrieve", transport=httpx.MockTransport(server)) as client:
        assert client.search(["who is Aaron", "q2"], k=2) == [[hit, hit], [hit, hit]]
    assert hit.title in ('"Aaron"', "Aaron")  # the title line, quotes kept as the corpus has them


@pytest.mark.parametrize("item", [{"document": {"id": "1"}}, {"id": "1"}, 3, {"document": 4, "score": 1}])
def test_a_hit_without_contents_is_a_malformed_answer(item: Any) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"result": [[item]]}))
    with pytest.raises(ValueError, match="malformed hit in the retrieval server's response"):
        HttpRetriever("http://stub", transport=transport).search(["q"], k=1)
