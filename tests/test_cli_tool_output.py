"""What the tool commands print (issue 70): their counts once, and the server's caps in its --help."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app

runner = CliRunner()


def test_data_convert_and_corpus_build_print_their_counts_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The library logs its counts at INFO for Python callers; a command prints them itself, so
    the library's line is held back while it runs (and only then)."""
    caplog.set_level(logging.INFO)
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"id": str(i), "question": "q?", "golden_answers": ["a"]}) + "\n" for i in range(3)))
    result = runner.invoke(app, ["data", "convert", str(records), "-f", "flashrag", "-o", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 0, result.output
    assert result.output.count(" 3 ") == 1 and not [r for r in caplog.records if r.name == "prorag.data.benchmarks"]

    paragraphs = tmp_path / "paragraphs.jsonl"
    rows = [("Ada", "Ada wrote the first program."), ("Bob", "Bob ran."), ("Ada", "Ada wrote the first program."), ("Eve", " ")]
    paragraphs.write_text("".join(json.dumps({"title": t, "text": x}) + "\n" for t, x in rows))
    result = runner.invoke(app, ["corpus", "build", str(paragraphs), "-o", str(tmp_path / "corpus.jsonl")])
    assert result.exit_code == 0, result.output
    assert not [r for r in caplog.records if r.name == "prorag.data.corpus"]
    assert result.output.splitlines()[-1].endswith(
        f"wrote 2 paragraphs to {tmp_path / 'corpus.jsonl'} (1 duplicates dropped, 1 empty texts skipped)"
    )
    assert logging.getLogger("prorag.data.corpus").level == logging.NOTSET, "held back only while the command ran"


def test_serve_retriever_help_states_its_caps() -> None:
    result = runner.invoke(app, ["serve-retriever", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "at most 512 queries (--max-batch; more: 413)" in text
    assert "topk from 1 to 100 (--max-topk; else 422)" in text
