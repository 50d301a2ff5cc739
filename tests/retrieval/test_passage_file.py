"""PassageFile: passages read by line offsets, as read_passages would read them, checked in one pass."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from prorag.core.errors import DataError
from prorag.data.records import Passage, read_passages
from prorag.retrieval.passage_file import PassageFile, scan_passages


def _open(path: Path) -> PassageFile:
    offsets, size = scan_passages(path)
    return PassageFile(path, offsets, size)


def test_rows_are_the_passages_read_passages_reads(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [{"id": i, "contents": f'"T{i}"\ntext {i} ünïcode', "extra": [i]} for i in range(7)]
    path.write_text("\n\n".join(json.dumps(r, ensure_ascii=i % 2 == 0) for i, r in enumerate(rows)) + "\n\n", encoding="utf-8")
    passages = _open(path)
    assert len(passages) == 7 and list(passages) == read_passages(path)
    assert passages[-1] == passages[6] == Passage("6", '"T6"\ntext 6 ünïcode')
    assert passages[2:4] == [passages[2], passages[3]]
    with pytest.raises(IndexError):
        passages[7]
    with ThreadPoolExecutor(4) as pool:  # pread: no shared file position between threads
        assert list(pool.map(lambda i: passages[i % 7].id, range(200))) == [str(i % 7) for i in range(200)]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "a", "contents": "x"}', "{oops"], r"c.jsonl:2: invalid JSON"),
        (
            ['{"id": "a", "contents": "x"}', '{"id": "a", "contents": "y"}'],
            r"c.jsonl:2: duplicate passage id 'a' \(first at line 1\)",
        ),
        (['{"id": "a"}'], r"c.jsonl:1: missing field 'contents'"),
        (['{"id": "a", "contents": "x", "partition": "w0"}'], r"c.jsonl:1: has a partition"),
        ([""], r"c.jsonl: the corpus has no passages"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=message):
        scan_passages(path)


def test_a_file_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "a", "contents": "x"}\n', encoding="utf-8")
    offsets, size = scan_passages(path)
    path.write_text('{"id": "a", "contents": "xy"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="the corpus changed, import it again"):
        PassageFile(path, offsets, size)
