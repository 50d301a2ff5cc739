"""The data-format registry: every built-in format registered with what it reads and expects, the
guess of a file's kind unchanged, and a format registered by a test read like a built-in."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import prorag.data.formats as formats_pkg
from prorag.core.errors import DataError
from prorag.data.benchmarks import FORMATS, iter_paragraphs, load_benchmark
from prorag.data.formats import DATA_FORMATS, DataFormat, guess_kind, record_formats, register_format
from prorag.data.records import Record

BUILTINS = ("hotpotqa", "2wiki", "musique", "flashrag", "paragraph list", "corpus")


@pytest.fixture
def registry_snapshot(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry restored after the test, so a format registered here leaks into no other test."""
    DATA_FORMATS.names()  # built-ins loaded before the snapshot
    monkeypatch.setattr(DATA_FORMATS, "_entries", dict(DATA_FORMATS._entries))
    yield


def write_jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- the built-ins


def test_every_builtin_module_is_found_and_registers() -> None:
    names = DATA_FORMATS.names()
    assert set(BUILTINS) <= set(names)
    folder = Path(formats_pkg.__file__).parent
    modules = [p.stem for p in folder.glob("*.py") if not p.name.startswith("_")]
    assert len(modules) == len(BUILTINS)  # one module per format
    assert all(f"prorag.data.formats.{m}" in sys.modules for m in modules)


def test_what_each_builtin_reads_and_expects() -> None:
    reads = {
        name: (DATA_FORMATS.get(name).records is not None, DATA_FORMATS.get(name).paragraphs is not None) for name in BUILTINS
    }
    assert reads == {
        "hotpotqa": (True, True),
        "2wiki": (True, True),
        "musique": (True, True),
        "flashrag": (True, False),
        "paragraph list": (False, True),
        "corpus": (False, True),
    }
    assert record_formats() == FORMATS == ("2wiki", "flashrag", "hotpotqa", "musique")
    for name in BUILTINS:
        fmt = DATA_FORMATS.get(name)
        assert fmt.name == name and fmt.priority > 0
        expected = {field.split(" ")[0] for field in fmt.expected_fields}
        assert fmt.identified_by and set(fmt.identified_by) <= expected, name
        assert all(other in DATA_FORMATS for other in fmt.accepts)


def _old_guess_kind(item: dict[str, Any]) -> str | None:
    """``guess_kind`` as it was before the registry, the reference the registry must reproduce."""
    if "paragraphs" in item and "question_decomposition" in item:
        return "musique"
    if "supporting_facts" in item and "context" in item:
        return "2wiki" if "evidences" in item else "hotpotqa"
    if "golden_answers" in item:
        return "flashrag"
    if "title" in item and "text" in item:
        return "paragraph list"
    if "contents" in item:
        return "corpus"
    return None


def test_guess_kind_unchanged_on_every_combination_of_identifying_fields() -> None:
    fields = sorted({f for name in BUILTINS for f in DATA_FORMATS.get(name).identified_by} | {"id", "question"})
    for n in range(len(fields) + 1):
        for present in itertools.combinations(fields, n):
            item = dict.fromkeys(present, 0)
            assert guess_kind(item) == _old_guess_kind(item), present


@pytest.mark.parametrize(
    ("rel", "kind"),
    [
        ("hotpotqa/hotpot_dev_hard_a.jsonl", "hotpotqa"),
        ("train/hotpotqa_train.json", "hotpotqa"),
        ("musique/musique_ans_dev_200.jsonl", "musique"),
        ("train/musique_train.json", "musique"),
        ("bamboogle/test.jsonl", "flashrag"),
        ("popqa/test_1000.jsonl", "flashrag"),
        ("corpora/2wiki_distractor_paragraphs.json", "paragraph list"),
    ],
)
def test_guess_kind_on_the_real_files(benchmarks_dir: Path, rel: str, kind: str) -> None:
    text = (benchmarks_dir / rel).read_text(encoding="utf-8")
    items = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    assert {guess_kind(i) for i in items} == {_old_guess_kind(items[0])} == {kind}


def test_a_format_must_read_something() -> None:
    with pytest.raises(ValueError, match="'empty' reads nothing"):
        DataFormat("empty", expected_fields=("x",))


# ----------------------------------------------------------------------------- a format registered here


def _toy_record(item: dict[str, Any], where: str, source: str) -> Record | str:
    if not item["a"]:
        return "no answer"
    return Record(str(item["n"]), item["q"], [item["a"]], {"source": source})


TOY = DataFormat(
    "toy",
    expected_fields=("n", "q", "a"),
    records=_toy_record,
    paragraphs=lambda item, where: [(item["q"], item["a"])],
    identified_by=("n", "q"),
)


def test_a_registered_format_is_read_by_name(tmp_path: Path, registry_snapshot: None) -> None:
    register_format(TOY)
    path = write_jsonl(tmp_path / "toy.jsonl", [{"n": 1, "q": "Who?", "a": "Ada"}, {"n": 2, "q": "Why?", "a": ""}])
    loaded = load_benchmark(path, "toy")
    assert [r.to_dict() for r in loaded.records] == [
        {"id": "1", "question": "Who?", "golden_answers": ["Ada"], "metadata": {"source": "toy"}}
    ]
    assert loaded.skipped == {"no answer": 1}
    assert "toy" in record_formats()
    assert list(iter_paragraphs(path)) == [("Who?", "Ada"), ("Why?", "")]
    register_format(TOY)  # the same format again (a module imported twice): harmless
    with pytest.raises(ValueError, match="data format 'toy' is already registered"):
        register_format(DataFormat("toy", expected_fields=("n",), records=_toy_record))
    # toy items given as musique are refused, naming toy's fields and flag
    with pytest.raises(DataError, match="not a musique item: .* it looks like a toy item \\(fields n, q, a; use --format toy\\)"):
        load_benchmark(path, "musique")


def test_a_user_format_never_changes_the_guess_of_a_builtin(registry_snapshot: None) -> None:
    register_format(DataFormat("mine", expected_fields=("contents",), paragraphs=lambda i, w: [], identified_by=("contents",)))
    assert guess_kind({"id": "x", "contents": "T\nx"}) == "corpus"  # equal fields: the built-in's priority wins
    register_format(
        DataFormat("mine", expected_fields=("contents",), paragraphs=lambda i, w: [], identified_by=("contents",), priority=99),
        replace=True,
    )
    assert guess_kind({"id": "x", "contents": "T\nx"}) == "mine"  # unless it says so


def test_replace_overrides_a_builtin(tmp_path: Path, registry_snapshot: None) -> None:
    flashrag = DATA_FORMATS.get("flashrag")
    upper = DataFormat(
        "flashrag",
        expected_fields=flashrag.expected_fields,
        records=lambda item, where, source: Record(str(item["id"]), item["question"].upper(), item["golden_answers"], {}),
        identified_by=flashrag.identified_by,
        priority=flashrag.priority,
    )
    register_format(upper, replace=True)
    path = write_jsonl(tmp_path / "r.jsonl", [{"id": 1, "question": "who?", "golden_answers": ["a"]}])
    assert load_benchmark(path, "flashrag").records[0].question == "WHO?"
