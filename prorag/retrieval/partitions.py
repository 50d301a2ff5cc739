"""The passages of an index and their partitions, shared by every index kind.

An index keeps its passages in corpus order (row ``i`` is passage ``i``) and, for each
partition, the rows that belong to it. Search is then "score the rows of one partition",
whatever the scoring: BM25 builds one sub-index per partition, dense search one FAISS index
per partition. This module owns what both kinds have in common: the row bookkeeping, the
grouping of a batch of queries by the partition each one searches (so every sub-index is
queried once per batch, not once per query), turning a sub-index's rows into :class:`Hit`
objects, and the
``passages.jsonl`` file both kinds store the passages in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prorag.data.jsonl import write_jsonl
from prorag.data.records import Passage, check_unique_ids, read_passages
from prorag.retrieval.base import Hit

#: File, inside an index folder, holding the passages in row order.
PASSAGES_FILE = "passages.jsonl"


class UnknownPartitionError(ValueError):
    """A query asked for a partition the index does not have."""


class PartitionedPassages:
    """Passages in row order plus the sorted rows of each partition.

    ``None`` (search everything) is not a partition: it is the whole corpus. A corpus whose
    passages all have ``partition=None`` (every real corpus) has no partitions at all.
    """

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.passages: Sequence[Passage] = list(passages)
        check_unique_ids(self.passages)
        rows: dict[str, list[int]] = {}
        for i, p in enumerate(self.passages):
            if p.partition is not None:
                rows.setdefault(p.partition, []).append(i)
        # Sorted names so that the on-disk layout does not depend on corpus order.
        self.rows: dict[str, np.ndarray] = {name: np.asarray(rows[name], dtype=np.int64) for name in sorted(rows)}

    @classmethod
    def unpartitioned(cls, passages: Sequence[Passage]) -> PartitionedPassages:
        """``passages`` kept as given, without partitions: for a corpus whose ids were checked when
        it was imported and that is read lazily (a :class:`list` copy would read all of it)."""
        corpus = cls.__new__(cls)
        corpus.passages, corpus.rows = passages, {}
        return corpus

    def __len__(self) -> int:
        return len(self.passages)

    @property
    def names(self) -> list[str]:
        """Partition names, sorted."""
        return list(self.rows)

    def group(self, partitions: Sequence[str | None]) -> dict[str | None, list[int]]:
        """Map each partition asked for (``None``: everything) to the query positions asking for it.

        Raises :class:`UnknownPartitionError` naming the first partition the index lacks.
        """
        groups: dict[str | None, list[int]] = {}
        for qi, name in enumerate(partitions):
            if name is not None and name not in self.rows:
                raise UnknownPartitionError(f"unknown partition {name!r} (query {qi}); the index has {_describe(self.names)}")
            groups.setdefault(name, []).append(qi)
        return groups

    def hits(self, partition: str | None, local_rows: Sequence[int], scores: Sequence[float]) -> list[Hit]:
        """Hits for rows numbered within ``partition``'s own sub-index (``None``: the whole corpus).

        A negative row (FAISS's "no result") is skipped.
        """
        rows = None if partition is None else self.rows[partition]
        out = []
        for local, score in zip(local_rows, scores, strict=True):
            if local >= 0:
                p = self.passages[local if rows is None else int(rows[local])]
                out.append(Hit(p.id, p.contents, float(score)))
        return out

    def save(self, directory: str | Path) -> None:
        """Write the passages (with their partitions) to ``directory/passages.jsonl``."""
        write_jsonl(Path(directory) / PASSAGES_FILE, (p.to_dict() for p in self.passages))

    @classmethod
    def load(cls, directory: str | Path) -> PartitionedPassages:
        return cls(read_passages(Path(directory) / PASSAGES_FILE))


def _describe(names: list[str]) -> str:
    if not names:
        return "no partitions (use null to search the whole corpus)"
    shown = ", ".join(repr(n) for n in names[:10])
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    return f"partitions {shown}{more}"


class PartitionedIndex:
    """What every in-process index reads off its :class:`PartitionedPassages` ``corpus``."""

    corpus: PartitionedPassages

    @property
    def num_passages(self) -> int:
        return len(self.corpus)

    @property
    def partitions(self) -> list[str]:
        return self.corpus.names
