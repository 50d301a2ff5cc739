"""A paragraph list: ``{title, text}`` items (2Wiki's distractor paragraphs, HippoRAG's corpora).

Paragraphs only, no questions: the corpus builder reads it, ``data convert`` does not.
"""

from __future__ import annotations

from typing import Any

from prorag.data.fields import get_field
from prorag.data.formats import DataFormat, register_format


def list_paragraph(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """The one ``(title, text)`` paragraph an entry is."""
    return [(get_field(item, "title", str, where).strip(), get_field(item, "text", str, where).strip())]


register_format(
    DataFormat(
        "paragraph list",
        expected_fields=("title", "text"),
        paragraphs=list_paragraph,
        identified_by=("title", "text"),
        priority=20,
    )
)
