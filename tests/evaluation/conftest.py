"""Fixtures of the generator-baseline tests: records and a retriever that logs its queries."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from prorag.data.records import Record
from prorag.retrieval.base import Hit


class LoggingRetriever:
    """Returns, per query, ``k`` hits whose ids name the query (``"<query>#i"``) and logs every query."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def search(self, queries: Sequence[str], k: int = 3, partitions: Sequence[str | None] | None = None) -> list[list[Hit]]:
        self.queries.extend(queries)
        return [[Hit(f"{q}#{i}", f"T{i}\nabout {q}", 1.0) for i in range(k)] for q in queries]


@pytest.fixture
def retriever() -> LoggingRetriever:
    return LoggingRetriever()


@pytest.fixture
def two_records() -> list[Record]:
    return [
        Record("q1", "Who directed Alpha?", ["Ann Lee"], {"gold_doc_ids": ["Who directed Alpha?#0"]}),
        Record("q2", "Where was Beta born?", ["Paris"]),
    ]
