"""Benchmark files: each multi-hop QA benchmark read in its own published schema.

:func:`load_benchmark` turns a file of any registered data format that reads records
(:mod:`prorag.data.formats`: HotpotQA, 2WikiMultihopQA, MuSiQue, FlashRAG, and any a user
registers) into :class:`~prorag.data.records.Record` objects; :func:`iter_paragraphs` yields the
context paragraphs of any file whose kind it can guess, for the corpus builder. Both use the same
per-format paragraph functions and one sentence-joining rule (:func:`join_sentences`), so a
loader's ``gold_doc_ids`` are exactly the corpus builder's ids. This module reads files; a format
reads one item.

Files may be JSONL or one JSON document (told apart by the first non-blank line). Every problem is
a :class:`~prorag.core.errors.DataError` at ``file:line`` (JSONL) or ``file: item N (id=...)``
(JSON list, N from 1) naming the field. ``FORMATS`` is computed on each access, so it includes
formats registered after this module was imported.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorag.core.errors import DataError, decode_utf8
from prorag.data.formats import DATA_FORMATS, guess_kind, record_formats, record_reader
from prorag.data.formats.hotpotqa import join_sentences
from prorag.data.jsonl import read_json, read_jsonl_numbered
from prorag.data.records import Record

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


def __getattr__(name: str) -> Any:
    """``FORMATS``: the formats :func:`load_benchmark` reads, now (a tuple of names)."""
    if name == "FORMATS":
        return record_formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class BenchmarkLoad:
    """Records read from one benchmark file, and how many items were skipped, by reason."""

    records: list[Record]
    skipped: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------- reading


def _read_document(path: PathLike) -> Iterator[tuple[str, dict[str, Any]]] | dict[str, Any]:
    """Read ``path`` as JSONL or as one JSON document.

    A file whose first non-blank line is itself a JSON object is JSONL (streamed, places
    ``file:line``); anything else is parsed whole. A JSON list gives its items (places
    ``file: item N (id=...)``); a JSON object (e.g. HotpotQA's ``{title: [sentences]}``
    paragraph map) is returned as is, for the caller to accept or refuse.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), "no such file")
    with path.open("rb") as f:
        first = next((decode_utf8(raw, str(path), n) for n, raw in enumerate(f, start=1) if raw.strip()), "")
    if not first:
        return iter(())
    if first.lstrip().startswith("{") and _is_json_object(first):
        return ((f"{path}:{n}", obj) for n, obj in read_jsonl_numbered(path))
    doc = read_json(path)
    if isinstance(doc, dict):
        return doc
    if not isinstance(doc, list):
        raise DataError(str(path), f"expected JSONL or a JSON list of objects, got a JSON {type(doc).__name__}")
    return _list_items(path, doc)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _list_items(path: Path, items: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for n, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise DataError(f"{path}: item {n}", f"expected a JSON object, got {type(item).__name__}")
        rid = item.get("id", item.get("_id"))
        yield (f"{path}: item {n}" + (f" (id={rid})" if rid is not None else "")), item


def _read_items(path: PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(place, item)`` of a question file; a JSON object document is refused."""
    doc = _read_document(path)
    if isinstance(doc, dict):
        raise DataError(str(path), "a JSON object (a paragraph map?), not questions: expected JSONL or a JSON list of items")
    return doc


# ----------------------------------------------------------------------------- kinds


def _check_kind(item: dict[str, Any], fmt: str, where: str) -> None:
    """Refuse an item that clearly belongs to another format, saying which fields were expected."""
    kind = guess_kind(item)
    spec = DATA_FORMATS.get(fmt)
    if kind is None or kind == fmt or kind in spec.accepts:
        return
    other = DATA_FORMATS.get(kind)
    hint = f"--format {kind}" if other.records is not None else "`prorag corpus build`"
    raise DataError(
        where,
        f"not a {fmt} item: expected fields {', '.join(spec.expected_fields)}; "
        f"it looks like a {kind} item (fields {', '.join(other.expected_fields)}; use {hint})",
    )


# ----------------------------------------------------------------------------- paragraphs


def _paragraph_map(doc: dict[str, Any], path: PathLike) -> Iterator[tuple[str, str]]:
    """A JSON object ``{title: [sentences] or text}`` (HippoRAG's HotpotQA corpus)."""
    for title, value in doc.items():
        if isinstance(value, str):
            yield title.strip(), value.strip()
        elif isinstance(value, list) and all(isinstance(s, str) for s in value):
            yield title.strip(), join_sentences(value)
        else:
            raise DataError(f"{path}: title {title!r}", "expected a list of sentences or a string")


def iter_paragraphs(path: PathLike) -> Iterator[tuple[str, str]]:
    """Yield ``(title, text)`` of every context paragraph of any supported file.

    The kind is detected from the first item (:func:`guess_kind`); every later item is read as
    that kind. Paragraph maps ``{title: [sentences]}`` are read too; a file of a format whose
    items carry no paragraphs (FlashRAG) yields nothing. Texts are built exactly as
    :func:`load_benchmark` builds them. MuSiQue's unanswerable items still contribute their
    paragraphs (they are real Wikipedia text).
    """
    doc = _read_document(path)
    if isinstance(doc, dict):
        yield from _paragraph_map(doc, path)
        return
    read = None
    for where, item in doc:
        if read is None:
            kind = guess_kind(item)
            if kind is None:
                expected = "; ".join(
                    f"{f.name}: {', '.join(f.expected_fields)}"
                    for f in map(DATA_FORMATS.get, DATA_FORMATS.names())
                    if f.identified_by
                )
                raise DataError(where, f"unrecognised item (fields {sorted(item)}); expected one of {expected}")
            read = DATA_FORMATS.get(kind).paragraphs or (lambda item, where: [])
        yield from read(item, where)


# ----------------------------------------------------------------------------- records


def load_benchmark(path: PathLike, fmt: str) -> BenchmarkLoad:
    """Read a benchmark file in its own published schema (JSONL or one JSON list).

    ``fmt`` is a registered data format that reads records (:func:`record_formats`); an unknown
    name is a ``ValueError`` with the registry's closest match. HotpotQA accepts its HF and
    original schemas (chosen per item) and so reads 2Wiki files too; an item that looks like
    another format is refused with a message naming the expected fields. Skipped items are
    counted by reason.
    """
    read = record_reader(fmt)
    records: list[Record] = []
    skipped: Counter[str] = Counter()
    for where, item in _read_items(path):
        _check_kind(item, fmt, where)
        result = read(item, where, fmt)
        if isinstance(result, str):
            skipped[result] += 1
        else:
            records.append(result)
    detail = ", ".join(f"{n} {reason}" for reason, n in skipped.items()) or "none"
    log.info("%s: read %d %s records (skipped: %s)", path, len(records), fmt, detail)
    return BenchmarkLoad(records, dict(skipped))


__all__ = ["BenchmarkLoad", "guess_kind", "iter_paragraphs", "join_sentences", "load_benchmark", "record_formats"]
