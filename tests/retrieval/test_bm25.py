"""BM25 retrieval: ranking, partition isolation, edge cases, persistence and index folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prorag.core.errors import DataError
from prorag.data.records import Passage
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.index import MANIFEST, build_index, load_index, open_retriever
from prorag.retrieval.partitions import UnknownPartitionError


@pytest.mark.parametrize(
    ("query", "title"),
    [
        ("Who created the Python programming language?", "Python (programming language)"),
        ("highest mountain in the Himalayas", "Mount Everest"),
        ("Which river has the largest discharge of water?", "Amazon River"),
        ("radioactivity research", "Marie Curie"),
        ("composer born in Salzburg", "Wolfgang Amadeus Mozart"),
    ],
)
def test_right_passage_ranks_first(plain: list[Passage], query: str, title: str) -> None:
    hits = BM25Retriever(plain).search([query], k=3)[0]
    assert hits[0].title == title
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_title_is_indexed(plain: list[Passage]) -> None:
    """ "Jupiter" only occurs in the title line of its passage."""
    passages = [Passage("j", "Jupiter\nThe fifth planet from the Sun.")] + plain[:4]
    assert BM25Retriever(passages).search(["jupiter"], k=1)[0][0].id == "j"


def test_partition_isolation(worlds: list[Passage]) -> None:
    retriever = BM25Retriever(worlds)
    query = "harbour town Zorvan capital of Quennar fishing"
    ids_a = {p.id for p in worlds if p.partition == "A"}
    # Unscoped, world B's Zorvan is the best match ...
    best = retriever.search([query], k=1)[0][0]
    assert best.id not in ids_a
    # ... yet a query scoped to A only ever sees A.
    scoped = retriever.search([query], k=10, partitions=["A"])[0]
    assert scoped and {h.id for h in scoped} <= ids_a
    assert scoped[0].title == "Zorvan"


def test_mixed_partitions_in_one_batch_match_single_queries(mixed: list[Passage]) -> None:
    retriever = BM25Retriever(mixed)
    queries = ["capital of Meldria", "capital of Meldria", "capital of Meldria", "largest planet", "the of"]
    parts = ["A", "B", None, None, "A"]
    batched = retriever.search(queries, k=3, partitions=parts)
    single = [retriever.search([q], k=3, partitions=[p])[0] for q, p in zip(queries, parts, strict=True)]
    assert batched == single
    assert batched[0] != batched[1]  # same words, different worlds
    assert {h.id for h in batched[1]} <= {p.id for p in mixed if p.partition == "B"}
    assert batched[4] == []


def test_unknown_partition_is_an_error(worlds: list[Passage]) -> None:
    with pytest.raises(UnknownPartitionError, match="'C'"):
        BM25Retriever(worlds).search(["Zorvan"], partitions=["C"])


def test_k_larger_than_corpus_and_partition(mixed: list[Passage]) -> None:
    retriever = BM25Retriever(mixed)
    hits = retriever.search(["Zorvan Meldria Ost Quennar capital"], k=100, partitions=["B"])[0]
    assert 0 < len(hits) <= 3
    assert len({h.id for h in hits}) == len(hits)
    everything = retriever.search(["Zorvan Meldria Ost Quennar capital river"], k=1000)[0]
    assert len(everything) == len({h.id for h in everything}) <= len(mixed)
    assert len(everything) >= 6


@pytest.mark.parametrize("query", ["", "   ", "the of and is", "xyzzy qwrtp", "a I ?!"])
def test_queries_without_indexed_terms_get_no_hits(plain: list[Passage], query: str) -> None:
    retriever = BM25Retriever(plain)
    results = retriever.search([query, "Eiffel Tower Paris"], k=3)
    assert results[0] == []
    assert results[1][0].title == "Eiffel Tower"


def test_hits_only_share_a_term_with_the_query(plain: list[Passage]) -> None:
    hits = BM25Retriever(plain).search(["violin"], k=5)[0]
    assert [h.title for h in hits] == ["Violin"]
    assert hits[0].score > 0


def test_argument_checks(plain: list[Passage]) -> None:
    retriever = BM25Retriever(plain)
    assert retriever.search([], k=3) == []
    with pytest.raises(TypeError):
        retriever.search("one string", k=3)
    with pytest.raises(ValueError, match="k must be"):
        retriever.search(["q"], k=0)
    with pytest.raises(ValueError, match="partitions has"):
        retriever.search(["q", "r"], k=1, partitions=[None])


def test_duplicate_ids_and_empty_corpus_are_refused(plain: list[Passage]) -> None:
    with pytest.raises(DataError, match="duplicate passage id"):
        BM25Retriever(plain + [Passage(plain[0].id, "Other\nother text")])
    with pytest.raises(DataError, match="no passages"):
        BM25Retriever([])


def test_save_load_round_trip(mixed: list[Passage], tmp_path: Path) -> None:
    retriever = BM25Retriever(mixed)
    retriever.save(tmp_path)
    loaded = BM25Retriever.load(tmp_path)
    queries = ["capital of Meldria", "Eiffel tower", "planet", "", "river"]
    parts = ["A", None, None, "B", "B"]
    assert loaded.search(queries, k=4, partitions=parts) == retriever.search(queries, k=4, partitions=parts)
    assert loaded.partitions == ["A", "B"] and loaded.num_passages == len(mixed)


def test_saved_files_are_not_pickles(mixed: list[Passage], tmp_path: Path) -> None:
    BM25Retriever(mixed).save(tmp_path)
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert {f.suffix for f in files} <= {".npy", ".json", ".jsonl"}
    npys = [f for f in files if f.suffix == ".npy"]
    assert npys
    for f in npys:  # object arrays would need pickle and fail here
        assert np.load(f, allow_pickle=False).dtype != object


def test_build_and_load_index(mixed_corpus_file: Path, tmp_path: Path) -> None:
    info = build_index(mixed_corpus_file, tmp_path / "idx")
    assert info["kind"] == "bm25" and info["num_passages"] == 16 and info["num_partitions"] == 2
    assert info["build_seconds"] >= 0
    retriever = load_index(tmp_path / "idx")
    assert isinstance(retriever, BM25Retriever)
    assert retriever.search(["Eiffel"], k=1)[0][0].title == "Eiffel Tower"
    assert isinstance(open_retriever(str(tmp_path / "idx")), BM25Retriever)


def test_incomplete_index_folder_is_refused(mixed_corpus_file: Path, tmp_path: Path) -> None:
    build_index(mixed_corpus_file, tmp_path)
    (tmp_path / MANIFEST).unlink()
    with pytest.raises(DataError, match="incomplete index"):
        load_index(tmp_path)


def test_interrupted_rebuild_keeps_the_old_index(
    mixed_corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "idx"
    build_index(mixed_corpus_file, out)
    manifest = (out / MANIFEST).read_text()

    def crash(self: BM25Retriever, directory: Path) -> None:
        (Path(directory) / "passages.jsonl").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(BM25Retriever, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        build_index(mixed_corpus_file, out)
    assert (out / MANIFEST).read_text() == manifest and [p.name for p in tmp_path.iterdir()] == ["idx"]
    monkeypatch.undo()
    assert load_index(out).num_passages == 16


def test_bad_index_folders(mixed_corpus_file: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such index folder"):
        load_index(tmp_path / "missing")
    with pytest.raises(DataError, match="not an index folder"):
        load_index(tmp_path)
    build_index(mixed_corpus_file, tmp_path / "idx")
    (tmp_path / "idx" / MANIFEST).write_text('{"kind": "colbert", "format_version": 1}')
    with pytest.raises(DataError, match="unknown index kind 'colbert'"):
        load_index(tmp_path / "idx")


def test_bm25_build_refuses_dense_options(mixed_corpus_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="only apply to dense"):
        build_index(mixed_corpus_file, tmp_path, model="some/model")
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(mixed_corpus_file, tmp_path, kind="splade")
