"""``prorag index`` and ``prorag retrieve`` through the real command line app."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.retrieval.index import MANIFEST

runner = CliRunner()


def test_index_then_retrieve(mixed_corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = runner.invoke(app, ["index", "--corpus", str(mixed_corpus_file), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "built bm25 index of 16 passages" in result.output
    assert (out / MANIFEST).is_file()

    result = runner.invoke(app, ["retrieve", "--index", str(out), "-k", "2", "Eiffel tower in Paris", "highest mountain"])
    assert result.exit_code == 0, result.output
    assert "# Eiffel tower in Paris" in result.output
    assert "Doc 1(Title: Eiffel Tower) The Eiffel Tower is a wrought-iron" in result.output
    assert "Doc 1(Title: Mount Everest)" in result.output

    for partition, text in [("A", "Meldria is a kingdom"), ("B", "Meldria is a desert")]:
        result = runner.invoke(app, ["retrieve", "--index", str(out), "--partition", partition, "-k", "1", "Meldria"])
        assert result.exit_code == 0, result.output
        assert f"Doc 1(Title: Meldria) {text}" in result.output


def test_retrieve_errors_are_one_line(mixed_corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    assert runner.invoke(app, ["index", "-c", str(mixed_corpus_file), "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["retrieve", "--index", str(out), "--partition", "Atlantis", "q"])
    assert result.exit_code == 2 and "unknown partition 'Atlantis'" in result.output
    (out / MANIFEST).unlink()
    result = runner.invoke(app, ["retrieve", "--index", str(out), "q"])
    assert result.exit_code == 2 and "incomplete index" in result.output
    result = runner.invoke(app, ["index", "-c", str(mixed_corpus_file), "-o", str(out), "--model", "x"])
    assert result.exit_code == 2 and "only apply to dense" in result.output


def test_failed_rebuild_keeps_the_working_index(mixed_corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    assert runner.invoke(app, ["index", "-c", str(mixed_corpus_file), "-o", str(out)]).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    lines = mixed_corpus_file.read_text().splitlines()
    bad = tmp_path / "dup.jsonl"
    bad.write_text("\n".join([*lines, lines[0]]) + "\n")  # valid lines, the last one's id a duplicate
    result = runner.invoke(app, ["index", "-c", str(bad), "-o", str(out)])
    assert result.exit_code == 2 and "duplicate passage id" in result.output, result.output
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.jsonl", "idx"]  # no temporary folder left
    assert runner.invoke(app, ["retrieve", "--index", str(out), "-k", "1", "Eiffel tower"]).exit_code == 0

    # A good rebuild replaces it (here with a smaller corpus); a folder that is not an index is never replaced.
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(lines[:3]) + "\n")
    result = runner.invoke(app, ["index", "-c", str(small), "-o", str(out)])
    assert result.exit_code == 0 and "index of 3 passages" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.jsonl", "idx", "small.jsonl"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    result = runner.invoke(app, ["index", "-c", str(small), "-o", str(tmp_path / "notes")])
    assert result.exit_code == 2 and "not an index" in result.output
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_serve_on_a_busy_port_is_a_clear_error(mixed_corpus_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    assert runner.invoke(app, ["index", "-c", str(mixed_corpus_file), "-o", str(out)]).exit_code == 0
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["serve-retriever", "--index", str(out), "--port", str(port)])
    assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in result.output


@pytest.mark.parametrize("port", ["70000", "65536", "-1"])
def test_serve_refuses_a_port_out_of_range(mixed_corpus_file: Path, tmp_path: Path, port: str) -> None:
    out = tmp_path / "idx"
    assert runner.invoke(app, ["index", "-c", str(mixed_corpus_file), "-o", str(out)]).exit_code == 0
    result = runner.invoke(app, ["serve-retriever", "--index", str(out), "--port", port])
    assert result.exit_code == 2 and "Invalid value for '--port'" in result.output
    assert "Traceback" not in result.output
