"""The Retriever contract shared by in-process indexes and the HTTP client.

A retriever is batched: many queries in, the top-k hits of each out. A query may be scoped
to a *partition* of the corpus (the built-in world keeps each of its parallel worlds in one
partition, so that a question only ever searches its own world); ``None`` searches the
whole corpus, which is what real corpora always do.

Documents are shown to the model as ``Doc i(Title: t) text``, one per line, as in the
ProRAG, Search-R1 and FlashRAG prompts (:func:`format_documents`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from prorag.data.records import TitledContents


@dataclass(frozen=True)
class Hit(TitledContents):
    """One retrieved passage with its score (higher is better)."""

    id: str
    contents: str
    score: float

    def to_wire(self) -> dict[str, Any]:
        """Search-R1 wire form: ``{"document": {"id", "contents"}, "score"}``."""
        return {"document": {"id": self.id, "contents": self.contents}, "score": self.score}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Hit:
        doc = d["document"]
        return cls(str(doc["id"]), str(doc["contents"]), float(d.get("score", 0.0)))


@runtime_checkable
class Retriever(Protocol):
    """Batched top-k search."""

    def search(
        self,
        queries: Sequence[str],
        k: int = 3,
        partitions: Sequence[str | None] | None = None,
    ) -> list[list[Hit]]:
        """Return, for each query, at most ``k`` hits, best first.

        ``partitions``, when given, has one entry per query: the partition that query
        searches (``None``: the whole corpus). An unknown partition is an error.
        """
        ...


def format_documents(hits: Sequence[Hit]) -> str:
    """Render hits for the model, one per line: ``Doc 1(Title: t) text``."""
    return "\n".join(f"Doc {i}(Title: {h.title}) {h.text}".rstrip() for i, h in enumerate(hits, start=1))


def check_search_args(queries: Sequence[str], k: int, partitions: Sequence[str | None] | None) -> list[str | None]:
    """Validate the common arguments of :meth:`Retriever.search`; return per-query partitions."""
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if partitions is None:
        return [None] * len(queries)
    if len(partitions) != len(queries):
        raise ValueError(f"partitions has {len(partitions)} entries for {len(queries)} queries")
    return list(partitions)
