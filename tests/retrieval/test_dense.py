"""Dense retrieval with the bundled all-MiniLM-L6-v2 (no download) on small hand-made corpora."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from prorag.data.jsonl import read_json
from prorag.data.records import Passage
from prorag.retrieval.dense import DEFAULT_MODEL, EMBEDDINGS_FILE, SETTINGS_FILE, DenseRetriever
from prorag.retrieval.index import MANIFEST, build_index, load_index
from prorag.retrieval.partitions import UnknownPartitionError

sentence_transformers = pytest.importorskip("sentence_transformers")

QUERIES = ["tallest peak on the planet", "capital of Meldria", "a string instrument", "", "river floods"]
PARTS: list[str | None] = [None, "A", None, "B", "B"]


@pytest.fixture(scope="module")
def dense(mixed: list[Passage]) -> DenseRetriever:
    """One retriever (one model load) shared by the read-only tests of this module."""
    return DenseRetriever(mixed)


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("What is the tallest peak on the planet?", "Mount Everest"),
        ("how green vegetation turns sunlight into sugar", "Photosynthesis"),
        ("biggest gas planet orbiting our star", "Jupiter"),
        ("who wrote symphonies in the classical era", "Wolfgang Amadeus Mozart"),
        ("a fiddle", "Violin"),
    ],
)
def test_paraphrase_finds_the_passage(dense: DenseRetriever, query: str, title: str) -> None:
    hits = dense.search([query], k=3)[0]
    assert hits[0].title == title
    assert len(hits) == 3
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert -1.001 <= hits[-1].score <= hits[0].score <= 1.001  # cosine similarities


def test_partition_isolation(dense: DenseRetriever, worlds: list[Passage]) -> None:
    query = "Zorvan, the harbour town of Quennar's fishing trade"
    ids_a = {p.id for p in worlds if p.partition == "A"}
    assert dense.search([query], k=1)[0][0].id not in ids_a  # B's Zorvan is the better match
    scoped = dense.search([query], k=10, partitions=["A"])[0]
    assert len(scoped) == 3 and {h.id for h in scoped} == ids_a  # k clipped to the partition
    with pytest.raises(UnknownPartitionError):
        dense.search([query], partitions=["C"])


def test_batch_equals_single_queries(dense: DenseRetriever) -> None:
    batched = dense.search(QUERIES, k=2, partitions=PARTS)
    single = [dense.search([q], k=2, partitions=[p])[0] for q, p in zip(QUERIES, PARTS, strict=True)]
    for b, s in zip(batched, single, strict=True):
        assert [h.id for h in b] == [h.id for h in s]
        assert [h.score for h in b] == pytest.approx([h.score for h in s], abs=1e-5)


def test_prefixes_are_applied(plain: list[Passage], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    original = sentence_transformers.SentenceTransformer.encode

    def recording_encode(self: Any, sentences: list[str], *args: Any, **kwargs: Any) -> Any:
        seen.extend(sentences)
        return original(self, sentences, *args, **kwargs)

    monkeypatch.setattr(sentence_transformers.SentenceTransformer, "encode", recording_encode)
    retriever = DenseRetriever(plain[:3], query_prefix="query: ", passage_prefix="passage: ")
    assert seen == ["passage: " + p.contents for p in plain[:3]]
    seen.clear()
    retriever.search(["who studied radioactivity", ""], k=1)
    assert seen == ["query: who studied radioactivity", "query: "]


def assert_same_results(a: list[list[Any]], b: list[list[Any]]) -> None:
    assert [[h.id for h in hits] for hits in a] == [[h.id for h in hits] for hits in b]
    for ha, hb in zip(a, b, strict=True):
        assert [h.score for h in ha] == pytest.approx([h.score for h in hb], abs=1e-6)


def test_save_load_round_trip(dense: DenseRetriever, tmp_path: Path) -> None:
    dense.save(tmp_path)
    loaded = DenseRetriever.load(tmp_path)
    assert np.array_equal(loaded.embeddings, dense.embeddings)
    assert_same_results(loaded.search(QUERIES, k=4, partitions=PARTS), dense.search(QUERIES, k=4, partitions=PARTS))


def test_build_index_writes_safetensors_and_no_pickle(dense: DenseRetriever, mixed_corpus_file: Path, tmp_path: Path) -> None:
    info = build_index(mixed_corpus_file, tmp_path, kind="dense", batch_size=4)
    assert info["kind"] == "dense" and info["num_passages"] == 16 and info["num_partitions"] == 2
    assert (tmp_path / MANIFEST).is_file() and (tmp_path / EMBEDDINGS_FILE).is_file()
    assert not [f for f in tmp_path.rglob("*") if f.suffix in {".pkl", ".pickle", ".pt", ".npy"}]
    settings = read_json(tmp_path / SETTINGS_FILE)
    assert settings["model"] == DEFAULT_MODEL and settings["dim"] == 384 and settings["normalized"] is True
    assert settings["query_prefix"] == "" and settings["passage_prefix"] == ""
    embeddings = safetensors.numpy.load_file(str(tmp_path / EMBEDDINGS_FILE))["embeddings"]
    assert embeddings.dtype == np.float32 and embeddings.shape == (16, 384)
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    loaded = load_index(tmp_path)
    assert isinstance(loaded, DenseRetriever)
    # Encoded in other batches than the fixture's, so equal up to float noise.
    got, want = loaded.search(QUERIES, k=3, partitions=PARTS), dense.search(QUERIES, k=3, partitions=PARTS)
    assert [[h.id for h in hits] for hits in got] == [[h.id for h in hits] for hits in want]


def test_prefixes_are_stored(plain: list[Passage], tmp_path: Path) -> None:
    DenseRetriever(plain[:2], query_prefix="query: ", passage_prefix="passage: ").save(tmp_path)
    loaded = DenseRetriever.load(tmp_path)
    assert (loaded.query_prefix, loaded.passage_prefix, loaded.model) == ("query: ", "passage: ", DEFAULT_MODEL)
