"""An empty record file is refused by ``eval`` and ``sft-data`` with one line naming it (exit 2),
before anything is written, instead of empty outputs or "wrote 0 trajectories" (issue 70)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.retrieval.index import build_index
from tests.test_cli_errors import fails_with_one_line


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text("\n  \n")  # blank lines only: no record
    return path


@pytest.fixture
def index(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "Ada\\nAda wrote the first program."}\n')
    build_index(corpus, tmp_path / "idx")
    return tmp_path / "idx"


def test_eval_refuses_an_empty_record_file(empty: Path, index: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    args = ["eval", "--policy", str(tmp_path / "policy"), "--data", str(empty), "--index", str(index), "--out", str(out)]
    fails_with_one_line(args, f"{empty}: no records (an empty file): nothing to evaluate; nothing written")
    assert not out.exists()


def test_sft_data_refuses_an_empty_record_file(empty: Path, index: Path, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    args = ["sft-data", "--data", str(empty), "--index", str(index), "--out", str(out)]
    fails_with_one_line(args, f"{empty}: no records (an empty file): no trajectories to write; nothing written")
    assert not out.exists()
