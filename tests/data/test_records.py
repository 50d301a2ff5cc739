"""Records and passages: validation messages name the field; ids hash title and text."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.core.errors import DataError
from prorag.data.records import Passage, Record, make_contents, passage_id, read_records

GOOD = {"id": "q1", "question": "Who?", "golden_answers": ["Ann"], "metadata": {"source": "x"}}


@pytest.mark.parametrize("key", ["id", "question", "golden_answers"])
def test_missing_field_is_named(key: str) -> None:
    d = {k: v for k, v in GOOD.items() if k != key}
    with pytest.raises(DataError) as err:
        Record.from_dict(d, where="f.jsonl:3")
    assert str(err.value) == f"f.jsonl:3: missing field '{key}'"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("id", ["q"]),
        ("id", True),
        ("question", "   "),
        ("question", 3),
        ("golden_answers", [{"a": 1}]),
        ("golden_answers", 5),
        ("metadata", [1]),
    ],
)
def test_wrong_type_is_named(key: str, value: object) -> None:
    with pytest.raises(DataError, match=rf"^f\.jsonl:3: field '{key}'"):
        Record.from_dict({**GOOD, key: value}, where="f.jsonl:3")


def test_golden_answers_string_becomes_list() -> None:
    assert Record.from_dict({**GOOD, "golden_answers": "Ann"}).golden_answers == ["Ann"]


def test_values_are_normalised() -> None:
    r = Record.from_dict({"id": 7, "question": "  Who?  ", "golden_answers": [1950, "x"]})
    assert (r.id, r.question, r.golden_answers, r.metadata) == ("7", "Who?", ["1950", "x"], {})


def test_round_trip() -> None:
    assert Record.from_dict(GOOD).to_dict() == GOOD


def test_read_records_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "recs.jsonl"
    path.write_text('{"id": 1, "question": "q", "golden_answers": ["a"]}\n\n{"id": 2, "question": "q"}\n')
    with pytest.raises(DataError, match=r"recs\.jsonl:3: missing field 'golden_answers'"):
        read_records(path)


def test_passage_id_hashes_title_and_text() -> None:
    a = passage_id("Springfield", "A city in Illinois.")
    assert a != passage_id("Springfield", "A city in Massachusetts.")  # same title, other text
    assert a != passage_id("Springfield (MA)", "A city in Illinois.")  # same text, other title
    assert a == passage_id("  Springfield ", "A city in Illinois.\n")  # outer whitespace ignored
    assert a.startswith("p") and len(a) == 16


def test_passage_title_and_text() -> None:
    p = Passage.from_title_text(" Springfield ", "Line one.\nLine two.")
    assert p.contents == make_contents("Springfield", "Line one.\nLine two.") == "Springfield\nLine one.\nLine two."
    assert (p.title, p.text) == ("Springfield", "Line one.\nLine two.")
    assert p.id == passage_id("Springfield", "Line one.\nLine two.")
    assert Passage("x", "Only a title").text == ""


def test_passage_from_dict_errors() -> None:
    with pytest.raises(DataError, match=r"^c\.jsonl:2: missing field 'contents'"):
        Passage.from_dict({"id": "x"}, where="c.jsonl:2")
    with pytest.raises(DataError, match=r"field 'partition'"):
        Passage.from_dict({"id": "x", "contents": "t\nx", "partition": 3}, where="c.jsonl:2")
    assert Passage.from_dict({"id": "x", "contents": "t\nx", "partition": "w1"}).to_dict() == {
        "id": "x",
        "contents": "t\nx",
        "partition": "w1",
    }
