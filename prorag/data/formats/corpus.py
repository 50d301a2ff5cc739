"""A prorag corpus: ``{id, contents}`` lines whose ``contents`` starts with the title line.

Paragraphs only (a corpus can be pooled into another one); the id is not kept, since the corpus
builder gives every paragraph its content-hash id again.
"""

from __future__ import annotations

from typing import Any

from prorag.data.formats import DataFormat, register_format
from prorag.data.records import Passage


def corpus_paragraph(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """The passage a corpus line is, as ``(title, text)``."""
    passage = Passage.from_dict(item, where)
    return [(passage.title.strip(), passage.text.strip())]


register_format(
    DataFormat(
        "corpus",
        expected_fields=("id", "contents"),
        paragraphs=corpus_paragraph,
        identified_by=("contents",),
        priority=10,
    )
)
