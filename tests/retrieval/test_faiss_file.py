"""Importing a FAISS index built elsewhere (``prorag index --faiss``): it searches as prorag's own dense
index of the same corpus does, through ``prorag retrieve`` and ``prorag serve-retriever``; a wrong
encoder, a corpus of another length or an L2 index is refused with one line, before any encoding.

The index is made here the way FlashRAG's and Search-R1's builders make theirs: passages prefixed
``passage: ``, embedded, L2-normalised, ``faiss.index_factory(d, "Flat", METRIC_INNER_PRODUCT)``; the
corpus lines are theirs too (``{"id": "0", "contents": "\\"Title\\"\\ntext"}``). The encoder is the
bundled all-MiniLM-L6-v2, so nothing downloads.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.core.errors import DataError
from prorag.data.records import Passage
from prorag.retrieval.client import HttpRetriever
from prorag.retrieval.dense import DEFAULT_MODEL, l2_normalise, resolve_model
from prorag.retrieval.faiss_file import FAISS_FILE, FaissFileRetriever, default_prefixes
from prorag.retrieval.index import MANIFEST, build_index, import_faiss_index, load_index, read_manifest
from prorag.retrieval.passage_file import PassageFile

runner = CliRunner()
QUERIES = ["the tallest mountain", "who composed symphonies", "a river in South America", "the largest planet"]
PREFIXES = ["--query-prefix", "query: ", "--passage-prefix", "passage: "]


def _rows(passages: list[Passage]) -> list[tuple[str, str]]:
    return [(p.title, p.text) for p in passages]


def _write_corpus(path: Path, rows: list[tuple[str, str]], blank_lines: bool = False) -> Path:
    lines = [json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) for i, (title, text) in enumerate(rows)]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n", encoding="utf-8")
    return path


def _write_faiss(path: Path, corpus: Path, *, metric: int = faiss.METRIC_INNER_PRODUCT, dim: int | None = None) -> Path:
    """Embed the corpus as the e5 index builders do (prefix, encode, normalise) and write a flat FAISS index."""
    contents = [json.loads(line)["contents"] for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    if dim is None:
        from sentence_transformers import SentenceTransformer

        vectors = l2_normalise(SentenceTransformer(resolve_model(DEFAULT_MODEL)).encode(["passage: " + c for c in contents]))
    else:
        vectors = l2_normalise(np.random.default_rng(0).standard_normal((len(contents), dim)))
    index = faiss.index_factory(vectors.shape[1], "Flat", metric)
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def built(plain: list[Passage], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(corpus, FAISS file) made elsewhere: a folder the tests only read."""
    folder = tmp_path_factory.mktemp("elsewhere")
    corpus = _write_corpus(folder / "wiki.jsonl", _rows(plain), blank_lines=True)
    return corpus, _write_faiss(folder / "e5_Flat.index", corpus)


@pytest.fixture(scope="module")
def imported(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus, index = built
    out = tmp_path_factory.mktemp("imported") / "idx"
    args = ["index", "--faiss", str(index), "--corpus", str(corpus), "--model", DEFAULT_MODEL, "--out", str(out), *PREFIXES]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "imported a FAISS index of 10 passages (384 dimensions" in result.output
    return out


def test_it_searches_as_prorag_own_dense_index_of_the_same_corpus(
    imported: Path, built: tuple[Path, Path], plain: list[Passage], tmp_path: Path
) -> None:
    own = tmp_path / "own"
    build_index(built[0], own, kind="dense", query_prefix="query: ", passage_prefix="passage: ")
    theirs, ours = load_index(imported).search(QUERIES, k=3), load_index(own).search(QUERIES, k=3)
    assert [[h.id for h in hits] for hits in theirs] == [[h.id for h in hits] for hits in ours]
    assert np.allclose([[h.score for h in hits] for hits in theirs], [[h.score for h in hits] for hits in ours], atol=1e-5)
    assert theirs[0][0].contents == '"Mount Everest"\n' + dict(_rows(plain))["Mount Everest"]  # the title keeps its quotes
    assert theirs[0][0].id == "4"  # the corpus's own ids: row 4 is line 4 of the passages, blank lines skipped


def test_the_folder_is_a_dense_index_recording_its_encoder(imported: Path, built: tuple[Path, Path]) -> None:
    manifest = read_manifest(imported)
    settings = manifest["settings"]
    assert manifest["kind"] == "dense" and manifest["num_passages"] == 10 and manifest["num_partitions"] == 0
    assert (settings["model"], settings["query_prefix"], settings["passage_prefix"], settings["dim"]) == (
        DEFAULT_MODEL,
        "query: ",
        "passage: ",
        384,
    )
    assert settings["metric"] == "inner_product" and settings["faiss_source"] == str(built[1].resolve())
    assert (imported / FAISS_FILE).stat().st_ino == built[1].stat().st_ino  # linked, not copied
    retriever = load_index(imported)
    assert isinstance(retriever, FaissFileRetriever) and retriever.mapped  # memory-mapped
    assert isinstance(retriever.corpus.passages, PassageFile) and retriever.partitions == []


def test_retrieve_and_its_errors_through_the_command_line(imported: Path) -> None:
    result = runner.invoke(app, ["retrieve", "--index", str(imported), "-k", "1", "the largest planet"])
    assert result.exit_code == 0, result.output
    assert 'Doc 1(Title: "Jupiter") Jupiter is the fifth planet' in result.output
    result = runner.invoke(app, ["retrieve", "--index", str(imported), "--partition", "A", "q"])
    assert result.exit_code == 2 and "unknown partition 'A'" in result.output


@pytest.mark.slow
def test_serve_retriever_serves_it(imported: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prorag.cli", "serve-retriever", "--index", str(imported), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).json() == {"status": "ok", "num_passages": 10}:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server not healthy after 120 s"
            time.sleep(0.2)
        with HttpRetriever(url) as client:
            assert client.search(QUERIES, k=2) == load_index(imported).search(QUERIES, k=2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def free_port() -> int:
    """A port the OS just handed out (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- refusals


def _refused(args: list[str]) -> str:
    result = runner.invoke(app, ["index", *args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output  # above it: loading bars at most
    return errors[0]


@pytest.fixture
def no_encoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any text encoded by any encoder fails the test."""
    from sentence_transformers import SentenceTransformer

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("something was encoded")

    monkeypatch.setattr(SentenceTransformer, "encode", refuse)
    yield


def test_an_encoder_of_another_dimension_is_refused_before_any_encoding(
    built: tuple[Path, Path], tmp_path: Path, no_encoding: None
) -> None:
    index = _write_faiss(tmp_path / "e5_768.index", built[0], dim=768)
    out = tmp_path / "idx"
    line = _refused(["--faiss", str(index), "--corpus", str(tmp_path / "not-read.jsonl"), "--out", str(out)])
    assert f"holds vectors of dimension 768, but the encoder {DEFAULT_MODEL} gives 384" in line and "--model" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["e5_768.index"]  # nothing left behind


def test_a_corpus_of_another_length_is_refused(
    built: tuple[Path, Path], plain: list[Passage], tmp_path: Path, no_encoding: None
) -> None:
    corpus = _write_corpus(tmp_path / "longer.jsonl", [*_rows(plain), ("Extra", "One passage more than the index has.")])
    line = _refused(["--faiss", str(built[1]), "--corpus", str(corpus), "--out", str(tmp_path / "idx"), *PREFIXES])
    assert f"{corpus}: has 11 passages, but {built[1]} holds 10 vectors" in line


def test_an_l2_index_and_a_file_that_is_no_index_are_refused(built: tuple[Path, Path], tmp_path: Path) -> None:
    l2 = _write_faiss(tmp_path / "l2.index", built[0], metric=faiss.METRIC_L2, dim=384)
    assert "not inner product" in _refused(["--faiss", str(l2), "--corpus", str(built[0]), "--out", str(tmp_path / "a")])
    junk = tmp_path / "junk.index"
    junk.write_bytes(b"not an index")
    assert "not a FAISS index" in _refused(["--faiss", str(junk), "--corpus", str(built[0]), "--out", str(tmp_path / "b")])


def test_a_corpus_changed_after_the_import_is_refused_on_load(
    built: tuple[Path, Path], plain: list[Passage], tmp_path: Path
) -> None:
    corpus = _write_corpus(tmp_path / "wiki.jsonl", _rows(plain))
    out = tmp_path / "idx"
    import_faiss_index(built[1], corpus, out, model=DEFAULT_MODEL, query_prefix="query: ", passage_prefix="passage: ")
    with (out / "passages.jsonl").open("a", encoding="utf-8") as f:  # the hard link: the corpus itself
        f.write(json.dumps({"id": "10", "contents": "late"}) + "\n")
    with pytest.raises(DataError, match="the corpus changed, import it again"):
        load_index(out)


def test_the_corpus_is_checked_line_by_line(built: tuple[Path, Path], plain: list[Passage], tmp_path: Path) -> None:
    corpus = tmp_path / "dup.jsonl"
    lines = [json.dumps({"id": "same" if i in (2, 7) else str(i), "contents": p.contents}) for i, p in enumerate(plain)]
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"dup.jsonl:8: duplicate passage id 'same' \(first at line 3\)"):
        import_faiss_index(built[1], corpus, tmp_path / "idx", model=DEFAULT_MODEL)
    assert MANIFEST not in {p.name for p in tmp_path.rglob("*")}


def test_e5_prefixes_are_the_default_for_an_e5_model_only() -> None:
    assert default_prefixes("intfloat/e5-base-v2", None, None) == ("query: ", "passage: ")
    assert default_prefixes("/models/E5-large", "", None) == ("", "passage: ")  # an explicit empty prefix stays empty
    assert default_prefixes(DEFAULT_MODEL, None, None) == ("", "")
    assert default_prefixes(None, "q: ", "p: ") == ("q: ", "p: ")
