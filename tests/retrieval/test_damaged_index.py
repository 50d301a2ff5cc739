"""Damaged index files name themselves (exit 2, one line), killed builds' folders are cleared by the
next build of the same index, and index files are readable by other users (issue 70)."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from prorag.core.errors import DataError
from prorag.data.jsonl import write_json
from prorag.data.records import Passage
from prorag.retrieval.dense import EMBEDDINGS_FILE, DenseRetriever
from prorag.retrieval.index import FORMAT_VERSION, MANIFEST, build_index, load_index
from tests.test_cli_errors import fails_with_one_line

# ----------------------------------------------------------------------------- dense: embeddings.safetensors


@pytest.fixture
def dense_index(tmp_path: Path, plain: list[Passage]) -> Path:
    """A dense index of ``plain`` with made-up unit embeddings (no encoder is loaded)."""
    vectors = np.random.default_rng(0).normal(size=(len(plain), 8)).astype(np.float32)
    retriever = DenseRetriever(plain, embeddings=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    out = tmp_path / "dense"
    retriever.save(out)
    write_json(out / MANIFEST, {"kind": "dense", "format_version": FORMAT_VERSION, "settings": retriever.settings()})
    assert load_index(out).num_passages == len(plain)
    return out


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
@pytest.mark.parametrize("command", ["retrieve", "serve-retriever"])
def test_damaged_embeddings_are_named(dense_index: Path, damage: str, command: str) -> None:
    path = dense_index / EMBEDDINGS_FILE
    data = path.read_bytes()
    path.write_bytes(b"\xff" * 64 if damage == "garbage" else data[: len(data) // 2])
    args = ["retrieve", "--index", str(dense_index), "q"] if command == "retrieve" else [command, "--index", str(dense_index)]
    line = fails_with_one_line(args, f"{path}: damaged safetensors file: ")
    assert line.endswith("rebuild the index with `prorag index`")


# ----------------------------------------------------------------------------- bm25: sub-index files


@pytest.fixture
def bm25_index(tmp_path: Path, mixed_corpus_file: Path) -> Path:
    out = tmp_path / "idx"
    build_index(mixed_corpus_file, out)
    return out


@pytest.mark.parametrize("name", ["data.csc.index.npy", "vocab.index.json", "params.index.json"])
def test_a_damaged_bm25_file_is_named(bm25_index: Path, name: str) -> None:
    path = bm25_index / "bm25" / "all" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    line = fails_with_one_line(["retrieve", "--index", str(bm25_index), "q"], f"{path}: ")
    assert line.endswith("the index is damaged, rebuild it with `prorag index`")
    with pytest.raises(DataError, match=f"^{path}: "):
        load_index(bm25_index)


# ----------------------------------------------------------------------------- killed builds


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_build_removes_folders_left_by_killed_builds_of_its_index(
    tmp_path: Path, mixed_corpus_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "idx"
    killed = tmp_path / f"idx.tmp-{dead_pid()}-0123abcd"  # a killed build of this version
    legacy = tmp_path / "idx.tmp-k2j3h4_x"  # a killed build of an older version (mkdtemp's name)
    running = tmp_path / f"idx.tmp-{os.getpid()}-89abcdef"  # a build still running
    other = tmp_path / "other.tmp-k2j3h4_x"  # another index's
    for folder in (killed, legacy, running, other):
        folder.mkdir()
        (folder / "passages.jsonl").write_text("{}\n")
    past = time.time() - 60
    os.utime(legacy, (past, past))
    with caplog.at_level(logging.WARNING, logger="prorag.retrieval.index"):
        build_index(mixed_corpus_file, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["idx", running.name, other.name])
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"removed 2 folder(s) left by killed builds of {out}: {killed.name}, {legacy.name}"]


# ----------------------------------------------------------------------------- modes


def test_index_files_are_readable_by_others(tmp_path: Path, mixed_corpus_file: Path) -> None:
    out, old = tmp_path / "idx", os.umask(0o022)
    try:
        build_index(mixed_corpus_file, out)
    finally:
        os.umask(old)
    modes = {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
    assert modes and {name: m for name, m in modes.items() if m not in (0o644, 0o755)} == {}
    assert modes[MANIFEST] == 0o644 and stat.S_IMODE(out.stat().st_mode) == 0o755
