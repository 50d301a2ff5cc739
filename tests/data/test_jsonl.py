"""JSONL io: precise error places, atomic writes, flushing appends, truncated tails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorag.core.errors import DataError
from prorag.data.jsonl import JsonlAppender, read_json, read_jsonl, read_jsonl_numbered, write_jsonl


def test_numbered_lines_count_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n', encoding="utf-8")
    assert list(read_jsonl_numbered(path)) == [(1, {"a": 1}), (4, {"a": 2})]


def test_bad_line_is_reported_as_file_colon_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    # lines: 1 ok, 2 blank, 3 blank, 4 ok, 5 broken
    path.write_text('{"a": 1}\n\n\n{"a": 2}\n{"a": \n{"a": 3}\n', encoding="utf-8")
    with pytest.raises(DataError) as err:
        list(read_jsonl(path))
    assert err.value.where == f"{path}:5"
    assert str(err.value).startswith(f"{path}:5: invalid JSON")


def test_non_object_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"rows\.jsonl:3: expected a JSON object, got list"):
        list(read_jsonl(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        list(read_jsonl(tmp_path / "absent.jsonl"))


def test_read_json_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_text('[\n  {"a": 1},\n  {"a": }\n]\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"doc\.json:3: invalid JSON"):
        read_json(path)


def test_atomic_write_keeps_old_file_when_rows_fail(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [{"old": 1}, {"old": 2}])
    before = path.read_bytes()

    def rows():
        yield {"new": 1}
        yield {"new": 2}
        raise RuntimeError("crash mid-way")

    with pytest.raises(RuntimeError, match="crash mid-way"):
        write_jsonl(path, rows())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left


def test_atomic_write_creates_folders_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.jsonl"
    assert write_jsonl(path, ({"i": i} for i in range(3))) == 3
    assert path.read_text(encoding="utf-8") == '{"i": 0}\n{"i": 1}\n{"i": 2}\n'


def test_appender_flushes_each_row(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    app = JsonlAppender(path)
    try:
        app.append({"i": 1})
        assert list(read_jsonl(path)) == [{"i": 1}]  # readable before close
        app.append({"i": 2})
        assert list(read_jsonl(path)) == [{"i": 1}, {"i": 2}]
    finally:
        app.close()


def test_appender_repairs_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"i": 1}\n{"i": 2}\n{"i": 3, "te', encoding="utf-8")  # killed mid-row
    with JsonlAppender(path) as app:
        app.append({"i": 4})
    assert path.read_text(encoding="utf-8") == '{"i": 1}\n{"i": 2}\n{"i": 4}\n'


def test_appender_keeps_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"i": 1}\n', encoding="utf-8")
    with JsonlAppender(path) as app:
        app.append({"i": 2})
    assert list(read_jsonl(path)) == [{"i": 1}, {"i": 2}]


def test_tolerate_truncated_tail(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"i": 1}\n{"i": 2}\n{"i": 3, "te', encoding="utf-8")
    assert list(read_jsonl(path, tolerate_truncated_tail=True)) == [{"i": 1}, {"i": 2}]
    with pytest.raises(DataError, match=r"log\.jsonl:3: invalid JSON"):
        list(read_jsonl(path))


def test_tolerate_truncated_tail_still_refuses_a_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"i": 1}\n{"i": \n{"i": 3}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"log\.jsonl:2"):
        list(read_jsonl(path, tolerate_truncated_tail=True))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.dictionaries(st.text(max_size=8), _json_values, max_size=4), max_size=5))
def test_write_read_round_trip(tmp_path_factory: pytest.TempPathFactory, rows: list[dict]) -> None:
    path = tmp_path_factory.mktemp("rt") / "rows.jsonl"
    write_jsonl(path, rows)
    assert list(read_jsonl(path)) == json.loads(json.dumps(rows))
