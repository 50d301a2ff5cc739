"""The two record types every part of the system exchanges.

* :class:`Record`: one question, FlashRAG JSONL ``{"id", "question", "golden_answers", "metadata"}``.
  Gold evidence and gold decompositions, when known, live in ``metadata`` under the keys of
  :data:`METADATA_KEYS`, so every loader and the built-in world speak the same language.
* :class:`Passage`: one corpus paragraph ``{"id", "contents"}`` whose first line is its title.
  An optional ``partition`` scopes retrieval (the built-in world keeps each of its parallel
  worlds in its own partition; real corpora have none).

Passage ids are content hashes (:func:`passage_id`) of title and text, so that a loader can
name the gold paragraphs of a question with the very ids the corpus builder will give them,
whatever order the corpus is pooled in.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl_numbered

#: Metadata keys with a shared meaning across loaders and the built-in world.
METADATA_KEYS = {
    "source": "which benchmark or generator produced the record (hotpotqa, 2wiki, musique, flashrag, world)",
    "type": "question type as the source names it (bridge, comparison, compositional, ...)",
    "hops": "number of reasoning hops when known",
    "gold_titles": "titles of the gold supporting paragraphs",
    "gold_doc_ids": "passage ids (passage_id) of the gold supporting paragraphs",
    "decomposition": "gold decomposition: list of {question, answer, doc_ids, titles}",
    "partition": "retrieval partition the question must search (built-in world only)",
}


def passage_id(title: str, text: str) -> str:
    """Stable id of a paragraph: a hash of its title and text (not of the title alone).

    MuSiQue has several different paragraphs under one title, so the title cannot be the key.
    """
    digest = hashlib.sha1(f"{title.strip()}\n{text.strip()}".encode()).hexdigest()
    return f"p{digest[:15]}"


def make_contents(title: str, text: str) -> str:
    """Corpus ``contents``: the title on the first line, the text after it."""
    return f"{title.strip()}\n{text.strip()}"


def split_contents(contents: str) -> tuple[str, str]:
    """The inverse of :func:`make_contents`: ``(title, text)`` (text empty when there is no second line)."""
    title, _, text = contents.partition("\n")
    return title, text


@dataclass
class Record:
    """One question with its gold answers (all aliases) and metadata."""

    id: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "record") -> Record:
        """Validate and build a record; errors name ``where`` and the offending field."""
        for key in ("id", "question", "golden_answers"):
            if key not in d:
                raise DataError(where, f"missing field '{key}'")
        rid = d["id"]
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise DataError(where, f"field 'id' must be a string, got {type(rid).__name__}")
        question = d["question"]
        if not isinstance(question, str) or not question.strip():
            raise DataError(where, "field 'question' must be a non-empty string")
        answers = d["golden_answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not all(isinstance(a, (str, int, float)) for a in answers):
            raise DataError(where, "field 'golden_answers' must be a list of strings")
        if not answers:
            raise DataError(where, "field 'golden_answers' is empty: a record needs at least one gold answer to be scored")
        metadata = d.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise DataError(where, "field 'metadata' must be an object")
        return cls(str(rid), question.strip(), [str(a) for a in answers], metadata)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "golden_answers": self.golden_answers, "metadata": self.metadata}

    @property
    def partition(self) -> str | None:
        """Retrieval partition this question searches (None: the whole corpus)."""
        return self.metadata.get("partition")


class TitledContents:
    """``title`` and ``text`` of a ``contents`` string whose first line is the title (corpus
    passages and retrieved hits share the layout)."""

    contents: str

    @property
    def title(self) -> str:
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        return split_contents(self.contents)[1]


@dataclass
class Passage(TitledContents):
    """One corpus paragraph: ``contents`` holds the title on its first line."""

    id: str
    contents: str
    partition: str | None = None

    @classmethod
    def from_title_text(cls, title: str, text: str, partition: str | None = None) -> Passage:
        return cls(passage_id(title, text), make_contents(title, text), partition)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "passage") -> Passage:
        for key in ("id", "contents"):
            if key not in d:
                raise DataError(where, f"missing field '{key}'")
        if not isinstance(d["contents"], str):
            raise DataError(where, "field 'contents' must be a string")
        part = d.get("partition")
        if part is not None and not isinstance(part, str):
            raise DataError(where, "field 'partition' must be a string when present")
        return cls(str(d["id"]), d["contents"], part)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "contents": self.contents}
        if self.partition is not None:
            d["partition"] = self.partition
        return d


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Read a FlashRAG JSONL record file, validating each line."""
    return [Record.from_dict(d, where=f"{path}:{n}") for n, d in read_jsonl_numbered(path)]


def read_passages(path: str | os.PathLike[str]) -> list[Passage]:
    """Read a corpus JSONL file, validating each line; passage ids must be unique."""
    numbered = [(f"{path}:{n}", Passage.from_dict(d, where=f"{path}:{n}")) for n, d in read_jsonl_numbered(path)]
    passages = [p for _, p in numbered]
    check_unique_ids(passages, [where for where, _ in numbered])
    return passages


def check_unique_ids(passages: Sequence[Passage], places: Sequence[str] | None = None) -> None:
    """Refuse a repeated passage id: hits are reported by id and gold evidence is matched by id.

    ``places`` names each passage in the error (``file:line``); without them, its position.
    """
    first: dict[str, int] = {}
    for i, p in enumerate(passages):
        if p.id in first:
            where, before = (places[i], places[first[p.id]]) if places else (f"passage {i}", f"passage {first[p.id]}")
            raise DataError(where, f"duplicate passage id {p.id!r} (first at {before}): ids must be unique in a corpus")
        first[p.id] = i
