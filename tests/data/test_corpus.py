"""Corpus pooling: de-duplication on title plus text, stable ids, gold ids present, CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from prorag.cli import app
from prorag.data.benchmarks import load_benchmark
from prorag.data.corpus import build_corpus
from prorag.data.jsonl import read_jsonl
from prorag.data.records import passage_id

MUSIQUE_DEV = "musique/musique_ans_dev_200.jsonl"
HOTPOT_A = "hotpotqa/hotpot_dev_hard_a.jsonl"


def write_list(path: Path, paragraphs: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(paragraphs), encoding="utf-8")
    return path


@pytest.fixture
def two_lists(tmp_path: Path) -> tuple[Path, Path]:
    first = write_list(
        tmp_path / "first.json",
        [
            {"title": "Ann Lee", "text": "Ann Lee was born in Paris."},
            {"title": "Ann Lee", "text": "Ann Lee later moved to Rome."},  # same title, other text: kept
        ],
    )
    second = write_list(
        tmp_path / "second.json",
        [
            {"title": "Ann Lee", "text": "Ann Lee was born in Paris."},  # exact duplicate: dropped
            {"title": "Rome", "text": "Rome is a city."},
            {"title": "Empty", "text": "   "},  # empty text: skipped
        ],
    )
    return first, second


def test_dedupe_on_title_and_text(two_lists: tuple[Path, Path]) -> None:
    first, second = two_lists
    built = build_corpus([first, second])
    assert [(p.title, p.text) for p in built.passages] == [
        ("Ann Lee", "Ann Lee was born in Paris."),
        ("Ann Lee", "Ann Lee later moved to Rome."),
        ("Rome", "Rome is a city."),
    ]
    assert built.added == {str(first): 2, str(second): 1}
    assert built.duplicates == 1
    assert [p.id for p in built.passages] == [passage_id(p.title, p.text) for p in built.passages]


def test_ids_do_not_depend_on_input_order(two_lists: tuple[Path, Path]) -> None:
    first, second = two_lists
    ab, ba = build_corpus([first, second]), build_corpus([second, first])
    assert {p.id: p.contents for p in ab.passages} == {p.id: p.contents for p in ba.passages}
    assert [p.title for p in ba.passages] == ["Ann Lee", "Rome", "Ann Lee"]  # first appearance
    assert ba.added == {str(second): 2, str(first): 1}


def test_gold_doc_ids_are_in_the_corpus(benchmarks_dir: Path) -> None:
    for rel, fmt in ((MUSIQUE_DEV, "musique"), (HOTPOT_A, "hotpotqa")):
        ids = {p.id for p in build_corpus([benchmarks_dir / rel]).passages}
        records = load_benchmark(benchmarks_dir / rel, fmt).records
        gold = [g for r in records for g in r.metadata["gold_doc_ids"]]
        assert len(gold) >= 2 * len(records)
        assert set(gold) <= ids
        steps = [g for r in records for s in r.metadata.get("decomposition", []) for g in s["doc_ids"]]
        assert set(steps) <= ids


def test_musique_keeps_several_paragraphs_per_title(benchmarks_dir: Path) -> None:
    passages = build_corpus([benchmarks_dir / MUSIQUE_DEV]).passages
    titles = [p.title for p in passages]
    assert len(set(titles)) < len(titles)


def test_pooled_corpus_of_all_shared_files(benchmarks_dir: Path) -> None:
    files = sorted(p for p in benchmarks_dir.rglob("*") if p.suffix in (".json", ".jsonl"))
    assert len(files) == 13
    built = build_corpus(files)
    rel = {str(Path(k).relative_to(benchmarks_dir)): v for k, v in built.added.items()}
    assert len(built.passages) == sum(rel.values()) == 22858  # README: "about 25,000"
    assert rel["corpora/2wiki_distractor_paragraphs.json"] == 6119
    # HippoRAG's train corpora hold exactly the paragraphs of the train questions
    assert rel["train/hotpotqa_train_corpus.json"] == rel["train/musique_train_corpus.json"] == 0
    assert len({p.id for p in built.passages}) == len(built.passages)


# ----------------------------------------------------------------------------- CLI


def test_cli_corpus_build_and_data_convert(benchmarks_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    corpus = tmp_path / "corpus.jsonl"
    result = runner.invoke(
        app,
        [
            "corpus",
            "build",
            str(benchmarks_dir / MUSIQUE_DEV),
            str(benchmarks_dir / "bamboogle/test.jsonl"),
            "--out",
            str(corpus),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = list(read_jsonl(corpus))
    assert f"wrote {len(rows)} paragraphs" in result.output
    assert len(rows) == len(build_corpus([benchmarks_dir / MUSIQUE_DEV]).passages)

    records = tmp_path / "musique.jsonl"
    result = runner.invoke(
        app, ["data", "convert", str(benchmarks_dir / MUSIQUE_DEV), "--format", "musique", "--out", str(records)]
    )
    assert result.exit_code == 0, result.output
    converted = list(read_jsonl(records))
    assert len(converted) == 200
    assert "wrote 200 records" in result.output
    ids = {r["id"] for r in rows}
    assert all(set(r["metadata"]["gold_doc_ids"]) <= ids for r in converted)


def test_cli_malformed_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "broken_musique.jsonl"
    bad.write_text(
        '{"id": "2hop__1", "question": "q", "answer": "a", "paragraphs": [], '
        '"question_decomposition": [{"question": "x", "answer": "y", "paragraph_support_idx": 3}]}\n'
    )
    runner = CliRunner()
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["data", "convert", str(bad), "-f", "musique", "-o", str(out)])
    assert result.exit_code == 2
    assert f"{bad}:1: 'paragraph_support_idx' 3 out of range (0 paragraphs)" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()

    result = runner.invoke(app, ["corpus", "build", str(bad), str(tmp_path / "absent.json"), "-o", str(out)])
    assert result.exit_code == 2
    assert "absent.json: no such file" in result.output
    assert not out.exists()
