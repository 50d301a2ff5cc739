"""MuSiQue: a 2-4 hop question, twenty paragraphs and its gold decomposition into sub-questions.

Unanswerable items (``answerable: false``) are skipped and counted, not read: their paragraphs
still reach the corpus (real Wikipedia text). Gold paragraphs are those the decomposition points
at (hop order), then any other ``is_supporting`` one; ``#k`` in a sub-question is resolved to
hop k's gold answer. ``type`` is the id's prefix (``2hop``, ``3hop1``, ...), which is how
MuSiQue names its composition shapes.
"""

from __future__ import annotations

import re
from typing import Any

from prorag.core.errors import DataError
from prorag.data.fields import get_field, item_id, json_type, question_text, str_list
from prorag.data.formats import DataFormat, register_format
from prorag.data.records import Record, passage_id

_HOP_REF = re.compile(r"#(\d+)")


def musique_paragraphs(item: dict[str, Any], where: str) -> list[tuple[int, str, str, bool]]:
    """``(idx, title, text, is_supporting)`` of each paragraph."""
    out = []
    for i, p in enumerate(get_field(item, "paragraphs", list, where)):
        name = f"paragraphs[{i}]"
        if not isinstance(p, dict):
            raise DataError(where, f"field '{name}' must be an object, got {json_type(p)}")
        out.append(
            (
                get_field(p, "idx", int, where, name=f"{name}.idx", default=i),
                get_field(p, "title", str, where, name=f"{name}.title").strip(),
                get_field(p, "paragraph_text", str, where, name=f"{name}.paragraph_text").strip(),
                get_field(p, "is_supporting", bool, where, name=f"{name}.is_supporting", default=False),
            )
        )
    return out


def musique_record(item: dict[str, Any], where: str, source: str) -> Record | str:
    """A MuSiQue item, or the skip reason ``"unanswerable"``."""
    rid = item_id(item, where)
    if not get_field(item, "answerable", bool, where, default=True):
        return "unanswerable"
    question = question_text(item, where)
    answer = get_field(item, "answer", str, where)
    aliases = str_list(item, "answer_aliases", where) if "answer_aliases" in item else []
    answers = list(dict.fromkeys(a.strip() for a in [answer, *aliases] if a.strip()))
    paragraphs: dict[int, tuple[str, str, bool]] = {}
    for idx, title, text, sup in musique_paragraphs(item, where):
        if idx in paragraphs:
            raise DataError(where, f"field 'paragraphs': idx {idx} appears twice")
        paragraphs[idx] = (title, text, sup)
    decomposition = _decomposition(item, paragraphs, where)
    gold = [i for step in decomposition for i in step.pop("_idx")]
    gold += [idx for idx, (_, _, sup) in paragraphs.items() if sup]
    gold = list(dict.fromkeys(gold))
    metadata: dict[str, Any] = {"source": source}
    if "__" in rid:
        metadata["type"] = rid.split("__", 1)[0]
    metadata.update(
        hops=len(decomposition),
        gold_titles=list(dict.fromkeys(paragraphs[i][0] for i in gold)),
        gold_doc_ids=list(dict.fromkeys(passage_id(*paragraphs[i][:2]) for i in gold)),
        decomposition=decomposition,
    )
    return Record(rid, question, answers, metadata)


def _decomposition(item: dict[str, Any], paragraphs: dict[int, tuple[str, str, bool]], where: str) -> list[dict[str, Any]]:
    """The gold decomposition with doc ids, titles and ``#k`` references resolved.

    Each step carries a private ``_idx`` (its paragraph indices) that the caller pops.
    A ``paragraph_support_idx`` of null (allowed by the schema) gives no doc.
    """
    steps: list[dict[str, Any]] = []
    for i, d in enumerate(get_field(item, "question_decomposition", list, where)):
        name = f"question_decomposition[{i}]"
        if not isinstance(d, dict):
            raise DataError(where, f"field '{name}' must be an object, got {json_type(d)}")
        sub_q = get_field(d, "question", str, where, name=f"{name}.question")
        sub_a = get_field(d, "answer", (str, int, float), where, name=f"{name}.answer")
        idx = get_field(d, "paragraph_support_idx", (int, type(None)), where, name=f"{name}.paragraph_support_idx")
        if idx is not None and idx not in paragraphs:
            raise DataError(where, f"'paragraph_support_idx' {idx} out of range ({len(paragraphs)} paragraphs)")
        idxs = [] if idx is None else [idx]
        step: dict[str, Any] = {
            "question": sub_q,
            "answer": str(sub_a),
            "doc_ids": [passage_id(*paragraphs[j][:2]) for j in idxs],
            "titles": [paragraphs[j][0] for j in idxs],
            "_idx": idxs,
        }
        if _HOP_REF.search(sub_q):
            step["question_resolved"] = _resolve_refs(sub_q, [s["answer"] for s in steps], where, name)
        steps.append(step)
    return steps


def _resolve_refs(sub_question: str, earlier_answers: list[str], where: str, name: str) -> str:
    """Replace each ``#k`` by the gold answer of hop k, which must come before this hop."""

    def answer(m: re.Match[str]) -> str:
        k = int(m.group(1))
        if not 1 <= k <= len(earlier_answers):
            raise DataError(where, f"field '{name}.question' refers to #{k}, not an earlier hop")
        return earlier_answers[k - 1]

    return _HOP_REF.sub(answer, sub_question)


register_format(
    DataFormat(
        "musique",
        expected_fields=("id", "question", "answer", "answer_aliases", "answerable", "paragraphs", "question_decomposition"),
        records=musique_record,
        paragraphs=lambda item, where: [(t, x) for _, t, x, _ in musique_paragraphs(item, where)],
        identified_by=("paragraphs", "question_decomposition"),
        priority=60,
    )
)

__all__ = ["musique_paragraphs", "musique_record"]
