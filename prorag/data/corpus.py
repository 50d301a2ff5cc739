"""Corpus building: pool the context paragraphs of benchmark files into one retrieval corpus.

Paragraphs are de-duplicated on title plus text, i.e. on :func:`~prorag.data.records.passage_id`
(MuSiQue has several different paragraphs under one title, so the title alone would lose
some). Ids are content hashes, so a paragraph keeps its id whatever the order or set of
inputs, and the ``gold_doc_ids`` written by :func:`~prorag.data.benchmarks.load_benchmark`
name corpus passages directly. The corpus keeps the order of first appearance.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from prorag.data.benchmarks import iter_paragraphs
from prorag.data.records import Passage, make_contents, passage_id

log = logging.getLogger(__name__)


@dataclass
class CorpusBuild:
    """A pooled corpus, how many new paragraphs each input added, and how many were dropped."""

    passages: list[Passage]
    added: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    empty: int = 0
    """Paragraphs skipped for an empty text."""


def build_corpus(inputs: Sequence[str | os.PathLike[str]]) -> CorpusBuild:
    """Pool the paragraphs of ``inputs`` (any file :func:`iter_paragraphs` reads).

    ``added`` maps each input, labelled by its path as given, to the paragraphs it was first
    to contribute; a paragraph already seen (in any input) counts as a duplicate. Paragraphs
    with an empty text are skipped and counted (``empty``): they cannot answer anything.
    """
    passages: dict[str, Passage] = {}
    added: dict[str, int] = {}
    duplicates = empty = 0
    for path in inputs:
        label = str(path)
        added.setdefault(label, 0)
        for title, text in iter_paragraphs(path):
            if not text.strip():
                empty += 1
                continue
            pid = passage_id(title, text)
            if pid in passages:
                duplicates += 1
                continue
            passages[pid] = Passage(pid, make_contents(title, text))
            added[label] += 1
    log.info(
        "pooled %d paragraphs from %d inputs (%d duplicates dropped, %d empty texts skipped)",
        len(passages),
        len(added),
        duplicates,
        empty,
    )
    return CorpusBuild(list(passages.values()), added, duplicates, empty)
