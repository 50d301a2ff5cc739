"""2WikiMultihopQA: HotpotQA's original schema plus ``evidences`` (the gold relation triples).

It reuses HotpotQA's readers, so the two loaders give the same texts and gold ids, and each
accepts the other's files. ``evidences`` is what tells a 2Wiki item from a HotpotQA one, hence
its higher priority. The module is named ``twowiki``: a module name cannot start with a digit.
"""

from __future__ import annotations

from prorag.data.formats import DataFormat, register_format
from prorag.data.formats.hotpotqa import hotpot_paragraphs, hotpot_record

register_format(
    DataFormat(
        "2wiki",
        expected_fields=("_id", "question", "answer", "supporting_facts", "context", "evidences"),
        records=hotpot_record,
        paragraphs=hotpot_paragraphs,
        identified_by=("supporting_facts", "context", "evidences"),
        accepts=("hotpotqa",),
        priority=50,
    )
)
