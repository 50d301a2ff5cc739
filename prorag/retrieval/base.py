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

from prorag.data.records import TitledContents, make_contents, passage_id, split_contents


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
    def from_wire(cls, item: Any) -> Hit:
        """A hit in any shape a Search-R1 retrieval server answers with.

        ``{"document": DOC, "score": s}`` with ``return_scores`` true; ``DOC`` alone with it false
        (its servers send ``return_scores`` false documents unwrapped); ``DOC`` is the corpus row
        (``{"id", "contents", ...}``), ``{"title", "text", "contents"}`` without an id (BM25 over
        stored contents), ``{"contents"}`` alone (web search) or the contents string itself (the
        rerank server). A missing id is the content hash ``prorag corpus build`` gives the same
        passage; a missing score is 0.0, the order being the server's.
        """
        wrapped = isinstance(item, dict) and "document" in item
        doc = item["document"] if wrapped else item
        score = float(item.get("score", 0.0)) if wrapped else 0.0
        if isinstance(doc, str):
            doc = {"contents": doc}
        if not isinstance(doc, dict):
            raise TypeError(f"a document must be an object or a string, got {type(doc).__name__}")
        if "contents" in doc:
            contents = str(doc["contents"])
        elif "title" in doc and "text" in doc:
            contents = make_contents(str(doc["title"]), str(doc["text"]))
        else:
            raise KeyError("contents")
        return cls(str(doc["id"]) if "id" in doc else passage_id(*split_contents(contents)), contents, score)


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
