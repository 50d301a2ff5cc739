"""FlashRAG records: ``{id, question, golden_answers, metadata}``, prorag's own record format.

Read as :class:`~prorag.data.records.Record` reads them; the item's metadata is kept whole and
``source`` added only when absent. The items carry no paragraphs: a FlashRAG file adds nothing
to a corpus.
"""

from __future__ import annotations

from typing import Any

from prorag.data.formats import DataFormat, register_format
from prorag.data.records import Record


def flashrag_record(item: dict[str, Any], where: str, source: str) -> Record:
    """A FlashRAG record, with ``metadata["source"]`` set if the file left it out."""
    record = Record.from_dict(item, where)
    record.metadata.setdefault("source", source)
    return record


register_format(
    DataFormat(
        "flashrag",
        expected_fields=("id", "question", "golden_answers"),
        records=flashrag_record,
        identified_by=("golden_answers",),
        priority=30,
    )
)
