"""Passages read from a corpus JSONL file on demand, by the byte offset of each line.

For a corpus too large to hold as objects (wiki-18: 21M passages, about 14 GB of JSON): one pass
(:func:`scan_passages`) checks every line as :func:`~prorag.data.records.read_passages` would
(valid JSON, an ``id`` and a ``contents``, unique ids) and records where each passage starts;
afterwards passage ``i`` is one ``pread`` of its own line (thread-safe: no shared file position),
and loading costs 8 bytes a passage. Blank lines are skipped, so row ``i`` is the ``i``-th passage,
as FlashRAG and Search-R1 number a corpus. The file's size is recorded with the offsets, and a file
whose size changed since is refused instead of serving the wrong lines.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import overload

import numpy as np

from prorag.core.errors import DataError, decode_utf8
from prorag.data.records import Passage


class PassageFile(Sequence[Passage]):
    """Row ``i`` of a corpus JSONL file, read when asked for; ``offsets`` has one entry per passage plus the end."""

    def __init__(self, path: str | os.PathLike[str], offsets: np.ndarray, size: int) -> None:
        self._fd = -1
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(str(self.path), "no such file: the corpus of this index is gone")
        if self.path.stat().st_size != size:
            raise DataError(
                str(self.path),
                f"is {self.path.stat().st_size} bytes, {size} when it was indexed: the corpus changed, import it again",
            )
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.size = size
        self._fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Passage: ...
    @overload
    def __getitem__(self, i: slice) -> list[Passage]: ...
    def __getitem__(self, i: int | slice) -> Passage | list[Passage]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"passage {i} of {len(self)}")
        i %= len(self)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        where = f"{self.path} (passage {i})"
        return Passage.from_dict(json.loads(decode_utf8(os.pread(self._fd, end - start, start), where)), where=where)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def scan_passages(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """One pass over a corpus JSONL file: the offsets :class:`PassageFile` reads by, and the file's size.

    Each line is checked (``file:line`` named in the error): JSON, a passage, an id seen once, and no
    ``partition`` (an index read from a file built elsewhere searches the whole corpus).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "no such file")
    starts = array("q")  # 8 bytes a passage, where a list of ints takes about 36
    first: dict[str, int] = {}
    position = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = decode_utf8(raw, str(path), lineno)
            if line.strip():
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(where, f"invalid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(obj, dict):
                    raise DataError(where, f"expected a JSON object, got {type(obj).__name__}")
                passage = Passage.from_dict(obj, where=where)
                if passage.partition is not None:
                    raise DataError(where, "has a partition: an imported index searches the whole corpus, so its corpus has none")
                if passage.id in first:
                    raise DataError(
                        where, f"duplicate passage id {passage.id!r} (first at line {first[passage.id]}): ids must be unique"
                    )
                first[passage.id] = lineno
                starts.append(position)
            position += len(raw)
    if not starts:
        raise DataError(str(path), "the corpus has no passages")
    starts.append(position)
    return np.frombuffer(starts, dtype=np.int64).copy(), position
