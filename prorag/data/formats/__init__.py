"""Data formats by name: what each kind of benchmark or corpus file holds, and how to read one item.

A format is a :class:`DataFormat` registered in :data:`DATA_FORMATS` under its name (what
``prorag data convert --format`` takes). It declares what it reads (question records, context
paragraphs, or both), the fields it expects, and the fields that identify its items when a
file's kind has to be guessed (:func:`guess_kind`). Reading whole files (JSONL or JSON, places
in messages) stays in :mod:`prorag.data.benchmarks`; a format only reads one item.

Built-in formats: every module of this package whose name does not start with ``_`` is imported
before the first look-up, and registers itself; adding one is adding a module, no list to edit.
A user's format registers itself the same way from any module, loaded by the command line
with ``--plugin`` or ``PRORAG_PLUGINS`` (:mod:`prorag.core.plugins`). Guessing is by
``priority`` when an item has the identifying fields of several formats (2Wiki's are
HotpotQA's plus ``evidences``); built-ins have positive priorities, so a user's (0 by
default) never changes what a built-in file is taken for.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prorag.core.registry import Registry
from prorag.data.records import Record

#: ``reader(item, where, source)`` -> a record, or a skip reason (counted, e.g. ``"unanswerable"``);
#: ``source`` is the format's name, for the record's ``metadata["source"]``.
RecordReader = Callable[[dict[str, Any], str, str], Record | str]
#: ``reader(item, where)`` -> ``(title, text)`` of each context paragraph the item carries.
ParagraphReader = Callable[[dict[str, Any], str], list[tuple[str, str]]]


@dataclass(frozen=True)
class DataFormat:
    """One kind of item, and how to read it.

    ``records`` reads a question item (None: the format holds no questions, only paragraphs,
    and is no ``--format`` choice); ``paragraphs`` reads its context paragraphs for the corpus
    builder (None: its items carry none, and a file of them adds nothing to a corpus).
    ``expected_fields`` are listed by the message that refuses an item of another format;
    ``identified_by`` are the fields whose presence makes :func:`guess_kind` take an item for
    this format (empty: never guessed), ``priority`` which of several matching formats wins;
    ``accepts`` names other formats whose items ``records`` reads as well.
    """

    name: str
    expected_fields: tuple[str, ...]
    records: RecordReader | None = None
    paragraphs: ParagraphReader | None = None
    identified_by: tuple[str, ...] = ()
    accepts: tuple[str, ...] = ()
    priority: int = 0

    def __post_init__(self) -> None:
        if self.records is None and self.paragraphs is None:
            raise ValueError(f"data format {self.name!r} reads nothing: give it records=, paragraphs= or both")


def _own_modules() -> tuple[str, ...]:
    """The package's public modules, each one built-in format (``_``-prefixed ones are helpers)."""
    return tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


#: Data formats by name (``prorag data convert --format``).
DATA_FORMATS: Registry[DataFormat] = Registry("data format", builtins=_own_modules())


def register_format(fmt: DataFormat, *, replace: bool = False) -> DataFormat:
    """Register ``fmt`` under its name (``replace``: override a format on purpose); returns it.

    With ``replace`` the built-ins are registered first, so that a user's format overrides a
    built-in rather than being refused by it later (the built-ins never replace)."""
    if replace:
        DATA_FORMATS.names()
    return DATA_FORMATS.register(fmt.name, replace=replace)(fmt)


def record_formats() -> tuple[str, ...]:
    """Names of the registered formats that read question records, sorted: registration order
    depends on which module was imported first, and help texts must not."""
    return tuple(sorted(name for name in DATA_FORMATS.names() if DATA_FORMATS.get(name).records is not None))


def record_reader(name: str) -> RecordReader:
    """The record reader of the registered format ``name``: an unknown name is the registry's
    ``ValueError`` (with its closest match), a paragraphs-only format one that lists the others."""
    read = DATA_FORMATS.get(name).records
    if read is None:
        raise ValueError(f"data format {name!r} holds paragraphs, not questions; expected one of {', '.join(record_formats())}")
    return read


def guess_kind(item: dict[str, Any]) -> str | None:
    """Which format an item looks like, from its identifying fields (None: none matches).

    Of the formats whose ``identified_by`` fields are all present, the highest ``priority``
    wins, and of equal ones the first registered.
    """
    best: DataFormat | None = None
    for name in DATA_FORMATS.names():
        fmt = DATA_FORMATS.get(name)
        if fmt.identified_by and all(k in item for k in fmt.identified_by):
            if best is None or fmt.priority > best.priority:
                best = fmt
    return best.name if best is not None else None


__all__ = [
    "DATA_FORMATS",
    "DataFormat",
    "ParagraphReader",
    "RecordReader",
    "guess_kind",
    "record_reader",
    "record_formats",
    "register_format",
]
