"""Files written atomically get the mode ``open`` would give them (0666 less the umask), not
``tempfile.mkstemp``'s 0600, which hid indexes and run outputs from other users."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorag.data.jsonl import JsonlAppender, atomic_writer, write_json, write_jsonl


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_writes_get_the_umasks_mode(tmp_path: Path, umask: None) -> None:
    write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}])
    write_json(tmp_path / "doc.json", {"a": 1})
    with atomic_writer(tmp_path / "blob.bin", "wb") as f:
        f.write(b"\0")
    with JsonlAppender(tmp_path / "appended.jsonl") as appender:
        appender.append({"a": 1})
    assert {p.name: oct(mode(p)) for p in tmp_path.iterdir()} == {
        name: "0o644" for name in ("rows.jsonl", "doc.json", "blob.bin", "appended.jsonl")
    }


def test_a_stricter_umask_is_respected(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_json(tmp_path / "doc.json", {"a": 1})
    finally:
        os.umask(old)
    assert mode(tmp_path / "doc.json") == 0o600
