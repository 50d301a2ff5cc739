"""HotpotQA: a question, its answer, ten context paragraphs and the supporting facts.

Both published schemas are read, chosen per item: the HF one (``id``; ``context`` and
``supporting_facts`` as ``{title: [..], sentences|sent_id: [..]}`` columns) and the original
one (``_id``; ``[[title, ...], ...]`` pairs), which 2WikiMultihopQA shares. Gold paragraphs are
the context paragraphs whose title is a supporting title; a supporting title missing from the
context is a warning, not an error. :func:`join_sentences` is the one rule that turns sentences
into a paragraph text, for this format, 2Wiki and HippoRAG's paragraph maps alike.
"""

from __future__ import annotations

import logging
from typing import Any

from prorag.core.errors import DataError
from prorag.data.fields import get_field, item_id, question_text, str_list
from prorag.data.formats import DataFormat, register_format
from prorag.data.records import Record, passage_id

log = logging.getLogger(__name__)


def join_sentences(sentences: list[str]) -> str:
    """One paragraph text from its sentences: the single joining rule of the package.

    HotpotQA's sentences keep their own leading spaces (join with ``""``), 2Wiki's do not
    (join with ``" "``), and both share one schema, so the rule looks at the data: if any
    sentence after the first starts with whitespace, join with ``""``, else with ``" "``.
    Loaders and the corpus builder both use it, so passage ids can never disagree.
    """
    sep = "" if any(s[:1].isspace() for s in sentences[1:]) else " "
    return sep.join(sentences).strip()


def title_columns(table: dict[str, Any], name: str, column: str, where: str) -> list[tuple[str, Any]]:
    """``(title, value)`` rows of the HF schema's column form ``{title: [..], column: [..]}``
    (``context`` and ``supporting_facts``), the two columns checked to be as long."""
    titles = str_list(table, "title", where, name=f"{name}.title")
    values = get_field(table, column, list, where, name=f"{name}.{column}")
    if len(titles) != len(values):
        raise DataError(where, f"field '{name}': {len(titles)} titles but {len(values)} {column} entries")
    return list(zip(titles, values, strict=True))


def hotpot_context(item: dict[str, Any], where: str) -> list[tuple[str, list[str]]]:
    """``(title, sentences)`` of each context paragraph, in either schema."""
    context = get_field(item, "context", (dict, list), where)
    if isinstance(context, dict):
        pairs = title_columns(context, "context", "sentences", where)
    else:
        pairs = []
        for i, pair in enumerate(context):
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise DataError(where, f"field 'context[{i}]' must be a [title, [sentences]] pair")
            pairs.append((pair[0], pair[1]))
    out = []
    for i, (title, sents) in enumerate(pairs):
        if not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
            raise DataError(where, f"field 'context' paragraph {i} ({title!r}): sentences must be a list of strings")
        out.append((title, sents))
    return out


def hotpot_paragraphs(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """``(title, text)`` of each context paragraph of a HotpotQA / 2Wiki item."""
    return [(title.strip(), join_sentences(sents)) for title, sents in hotpot_context(item, where)]


def supporting_facts(item: dict[str, Any], where: str) -> list[list[Any]]:
    """Raw ``[[title, sent_id], ...]`` pairs, from either schema."""
    facts = get_field(item, "supporting_facts", (dict, list), where)
    if isinstance(facts, dict):
        facts = [list(pair) for pair in title_columns(facts, "supporting_facts", "sent_id", where)]
    for i, pair in enumerate(facts):
        ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
        if not ok or not isinstance(pair[1], int) or isinstance(pair[1], bool):
            raise DataError(where, f"field 'supporting_facts[{i}]' must be a [title, sent_id] pair, got {pair!r}")
    return [[t, s] for t, s in facts]


def _gold_from_titles(paragraphs: list[tuple[str, str]], titles: list[str], where: str) -> list[str]:
    """Ids of the context paragraphs whose title is one of ``titles`` (in ``titles`` order)."""
    ids: list[str] = []
    for title in titles:
        found = [passage_id(t, x) for t, x in paragraphs if t == title.strip()]
        if not found:
            log.warning("%s: supporting title %r is not among the context paragraphs", where, title)
        ids.extend(i for i in found if i not in ids)
    return ids


def hotpot_record(item: dict[str, Any], where: str, source: str) -> Record:
    """A HotpotQA (either schema) or 2Wiki item; 2Wiki's ``evidences`` go to metadata when present."""
    rid = item_id(item, where)
    question = question_text(item, where)
    answer = get_field(item, "answer", str, where)
    paragraphs = hotpot_paragraphs(item, where)
    facts = supporting_facts(item, where)
    gold_titles = list(dict.fromkeys(t for t, _ in facts))
    metadata: dict[str, Any] = {"source": source}
    for key in ("type", "level"):
        if key in item:
            metadata[key] = get_field(item, key, str, where)
    metadata.update(
        hops=2,
        gold_titles=gold_titles,
        gold_doc_ids=_gold_from_titles(paragraphs, gold_titles, where),
        supporting_facts=facts,
    )
    if "evidences" in item:
        metadata["evidences"] = get_field(item, "evidences", list, where)
    return Record(rid, question, [answer], metadata)


register_format(
    DataFormat(
        "hotpotqa",
        expected_fields=("id (or _id)", "question", "answer", "supporting_facts", "context"),
        records=hotpot_record,
        paragraphs=hotpot_paragraphs,
        identified_by=("supporting_facts", "context"),
        accepts=("2wiki",),
        priority=40,
    )
)

__all__ = ["hotpot_paragraphs", "hotpot_record", "join_sentences"]
