"""Benchmark loaders: each multi-hop QA benchmark read in its own published schema.

:func:`load_benchmark` turns a HotpotQA, 2WikiMultihopQA, MuSiQue or FlashRAG file into
:class:`~prorag.data.records.Record` objects (metadata keys :data:`~prorag.data.records.METADATA_KEYS`);
:func:`iter_paragraphs` yields the context paragraphs of any supported file for the corpus builder.
Both use the same per-format paragraph functions and one sentence-joining rule
(:func:`join_sentences`), so a loader's ``gold_doc_ids`` are exactly the corpus builder's ids.

Files may be JSONL or one JSON document (told apart by the first non-blank line). Every problem is
a :class:`~prorag.core.errors.DataError` at ``file:line`` (JSONL) or ``file: item N (id=...)``
(JSON list, N from 1) naming the field.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorag.core.errors import DataError, decode_utf8
from prorag.data.jsonl import read_json, read_jsonl_numbered
from prorag.data.records import Passage, Record, passage_id

log = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]

#: Formats :func:`load_benchmark` reads (the ``--format`` of ``prorag data convert``).
FORMATS = ("hotpotqa", "2wiki", "musique", "flashrag")

#: Fields that identify each kind of item, and that a missing-field message lists.
_EXPECTED_FIELDS = {
    "hotpotqa": "id (or _id), question, answer, supporting_facts, context",
    "2wiki": "_id, question, answer, supporting_facts, context, evidences",
    "musique": "id, question, answer, answer_aliases, answerable, paragraphs, question_decomposition",
    "flashrag": "id, question, golden_answers",
    "paragraph list": "title, text",
    "corpus": "id, contents",
}

#: Which guessed kinds each format accepts (2Wiki's schema is HotpotQA's original one).
_COMPATIBLE = {
    "hotpotqa": {"hotpotqa", "2wiki"},
    "2wiki": {"hotpotqa", "2wiki"},
    "musique": {"musique"},
    "flashrag": {"flashrag"},
}

_HOP_REF = re.compile(r"#(\d+)")


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


# ----------------------------------------------------------------------------- validation

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    type(None): "null",
}
_REQUIRED = object()


def _get(
    obj: dict[str, Any],
    key: str,
    types: type | tuple[type, ...],
    where: str,
    *,
    name: str | None = None,
    default: Any = _REQUIRED,
) -> Any:
    """``obj[key]`` checked against ``types``; the one item-validation helper of every format.

    ``name`` is the field as the message shows it (``paragraphs[3].title``); ``default`` is
    returned for an absent optional field. ``bool`` never passes for ``int`` (JSON ``true``
    is no paragraph index).
    """
    name = name or key
    if key not in obj:
        if default is _REQUIRED:
            raise DataError(where, f"field '{name}' missing")
        return default
    value = obj[key]
    types_ = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types_) or (isinstance(value, bool) and bool not in types_):
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types_)
        raise DataError(where, f"field '{name}' must be {want}, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    names = {
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _str_list(obj: dict[str, Any], key: str, where: str, *, name: str | None = None) -> list[str]:
    """A list field whose members must all be strings."""
    name = name or key
    values = _get(obj, key, list, where, name=name)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(where, f"field '{name}[{i}]' must be a string, got {_json_type(v)}")
    return values


def _item_id(item: dict[str, Any], where: str) -> str:
    """The item id, from ``id`` or HotpotQA/2Wiki's original ``_id``."""
    key = "_id" if "_id" in item else "id"
    if key not in item:
        raise DataError(where, "field 'id' (or '_id') missing")
    return str(_get(item, key, (str, int), where))


def _question(item: dict[str, Any], where: str) -> str:
    question = _get(item, "question", str, where)
    if not question.strip():
        raise DataError(where, "field 'question' is empty")
    return question.strip()


def guess_kind(item: dict[str, Any]) -> str | None:
    """Which kind of file an item looks like, from its identifying fields (None: unknown).

    Kinds are the :data:`FORMATS` plus ``"paragraph list"`` (``{title, text}``) and
    ``"corpus"`` (``{id, contents}``). A HotpotQA-shaped item with ``evidences`` is 2Wiki.
    """
    if "paragraphs" in item and "question_decomposition" in item:
        return "musique"
    if "supporting_facts" in item and "context" in item:
        return "2wiki" if "evidences" in item else "hotpotqa"
    if "golden_answers" in item:
        return "flashrag"
    if "title" in item and "text" in item:
        return "paragraph list"
    if "contents" in item:
        return "corpus"
    return None


def _check_kind(item: dict[str, Any], fmt: str, where: str) -> None:
    """Refuse an item that clearly belongs to another format, saying which fields were expected."""
    kind = guess_kind(item)
    if kind is None or kind in _COMPATIBLE[fmt]:
        return
    hint = f"--format {kind}" if kind in FORMATS else "`prorag corpus build`"
    raise DataError(
        where,
        f"not a {fmt} item: expected fields {_EXPECTED_FIELDS[fmt]}; "
        f"it looks like a {kind} item (fields {_EXPECTED_FIELDS[kind]}; use {hint})",
    )


# ----------------------------------------------------------------------------- paragraphs


def join_sentences(sentences: list[str]) -> str:
    """One paragraph text from its sentences: the single joining rule of the package.

    HotpotQA's sentences keep their own leading spaces (join with ``""``), 2Wiki's do not
    (join with ``" "``), and both share one schema, so the rule looks at the data: if any
    sentence after the first starts with whitespace, join with ``""``, else with ``" "``.
    Loaders and the corpus builder both use it, so passage ids can never disagree.
    """
    sep = "" if any(s[:1].isspace() for s in sentences[1:]) else " "
    return sep.join(sentences).strip()


def _hotpot_context(item: dict[str, Any], where: str) -> list[tuple[str, list[str]]]:
    """``(title, sentences)`` of each context paragraph, in either HotpotQA schema.

    HF: ``context = {title: [..], sentences: [[..]]}``; original (and 2Wiki):
    ``context = [[title, [sentences]], ...]``.
    """
    context = _get(item, "context", (dict, list), where)
    if isinstance(context, dict):
        pairs = _title_columns(context, "context", "sentences", where)
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


def _hotpot_paragraphs(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """``(title, text)`` of each context paragraph of a HotpotQA / 2Wiki item."""
    return [(title.strip(), join_sentences(sents)) for title, sents in _hotpot_context(item, where)]


def _musique_paragraphs(item: dict[str, Any], where: str) -> list[tuple[int, str, str, bool]]:
    """``(idx, title, text, is_supporting)`` of each MuSiQue paragraph."""
    out = []
    for i, p in enumerate(_get(item, "paragraphs", list, where)):
        name = f"paragraphs[{i}]"
        if not isinstance(p, dict):
            raise DataError(where, f"field '{name}' must be an object, got {_json_type(p)}")
        out.append(
            (
                _get(p, "idx", int, where, name=f"{name}.idx", default=i),
                _get(p, "title", str, where, name=f"{name}.title").strip(),
                _get(p, "paragraph_text", str, where, name=f"{name}.paragraph_text").strip(),
                _get(p, "is_supporting", bool, where, name=f"{name}.is_supporting", default=False),
            )
        )
    return out


def _list_paragraph(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """A paragraph-list entry ``{title, text}`` (2Wiki distractors, HippoRAG corpora)."""
    return [(_get(item, "title", str, where).strip(), _get(item, "text", str, where).strip())]


def _corpus_paragraph(item: dict[str, Any], where: str) -> list[tuple[str, str]]:
    """A corpus line ``{id, contents}``: the title is the first line of ``contents``."""
    passage = Passage.from_dict(item, where)
    return [(passage.title.strip(), passage.text.strip())]


def _paragraph_map(doc: dict[str, Any], path: PathLike) -> Iterator[tuple[str, str]]:
    """A JSON object ``{title: [sentences] or text}`` (HippoRAG's HotpotQA corpus)."""
    for title, value in doc.items():
        if isinstance(value, str):
            yield title.strip(), value.strip()
        elif isinstance(value, list) and all(isinstance(s, str) for s in value):
            yield title.strip(), join_sentences(value)
        else:
            raise DataError(f"{path}: title {title!r}", "expected a list of sentences or a string")


_PARAGRAPH_READERS: dict[str, Callable[[dict[str, Any], str], list[tuple[str, str]]]] = {
    "hotpotqa": _hotpot_paragraphs,
    "2wiki": _hotpot_paragraphs,
    "musique": lambda item, where: [(t, x) for _, t, x, _ in _musique_paragraphs(item, where)],
    "flashrag": lambda item, where: [],
    "paragraph list": _list_paragraph,
    "corpus": _corpus_paragraph,
}


def iter_paragraphs(path: PathLike) -> Iterator[tuple[str, str]]:
    """Yield ``(title, text)`` of every context paragraph of any supported file.

    The kind is detected from the first item (:func:`guess_kind`); every later item must be
    of the same kind. Paragraph maps ``{title: [sentences]}`` are read too; FlashRAG files
    yield nothing. Texts are built exactly as :func:`load_benchmark` builds them. MuSiQue's
    unanswerable items still contribute their paragraphs (they are real Wikipedia text).
    """
    doc = _read_document(path)
    if isinstance(doc, dict):
        yield from _paragraph_map(doc, path)
        return
    kind: str | None = None
    for where, item in doc:
        if kind is None:
            kind = guess_kind(item)
            if kind is None:
                expected = "; ".join(f"{k}: {v}" for k, v in _EXPECTED_FIELDS.items())
                raise DataError(where, f"unrecognised item (fields {sorted(item)}); expected one of {expected}")
        yield from _PARAGRAPH_READERS[kind](item, where)


# ----------------------------------------------------------------------------- records


def _gold_from_titles(paragraphs: list[tuple[str, str]], titles: list[str], where: str) -> list[str]:
    """Ids of the context paragraphs whose title is one of ``titles`` (in ``titles`` order)."""
    ids: list[str] = []
    for title in titles:
        found = [passage_id(t, x) for t, x in paragraphs if t == title.strip()]
        if not found:
            log.warning("%s: supporting title %r is not among the context paragraphs", where, title)
        ids.extend(i for i in found if i not in ids)
    return ids


def _title_columns(table: dict[str, Any], name: str, column: str, where: str) -> list[tuple[str, Any]]:
    """``(title, value)`` rows of the HF schema's column form ``{title: [..], column: [..]}``
    (HotpotQA's ``context`` and ``supporting_facts``), the two columns checked to be as long."""
    titles = _str_list(table, "title", where, name=f"{name}.title")
    values = _get(table, column, list, where, name=f"{name}.{column}")
    if len(titles) != len(values):
        raise DataError(where, f"field '{name}': {len(titles)} titles but {len(values)} {column} entries")
    return list(zip(titles, values, strict=True))


def _supporting_facts(item: dict[str, Any], where: str) -> list[list[Any]]:
    """Raw ``[[title, sent_id], ...]`` pairs, from either HotpotQA schema."""
    facts = _get(item, "supporting_facts", (dict, list), where)
    if isinstance(facts, dict):
        facts = [list(pair) for pair in _title_columns(facts, "supporting_facts", "sent_id", where)]
    for i, pair in enumerate(facts):
        ok = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
        if not ok or not isinstance(pair[1], int) or isinstance(pair[1], bool):
            raise DataError(where, f"field 'supporting_facts[{i}]' must be a [title, sent_id] pair, got {pair!r}")
    return [[t, s] for t, s in facts]


def _hotpot_record(item: dict[str, Any], where: str, source: str) -> Record:
    """A HotpotQA (HF or original schema) or 2Wiki item; the schema is read per item."""
    rid = _item_id(item, where)
    question = _question(item, where)
    answer = _get(item, "answer", str, where)
    paragraphs = _hotpot_paragraphs(item, where)
    facts = _supporting_facts(item, where)
    gold_titles = list(dict.fromkeys(t for t, _ in facts))
    metadata: dict[str, Any] = {"source": source}
    for key in ("type", "level"):
        if key in item:
            metadata[key] = _get(item, key, str, where)
    metadata.update(
        hops=2,
        gold_titles=gold_titles,
        gold_doc_ids=_gold_from_titles(paragraphs, gold_titles, where),
        supporting_facts=facts,
    )
    if "evidences" in item:
        metadata["evidences"] = _get(item, "evidences", list, where)
    return Record(rid, question, [answer], metadata)


def _musique_record(item: dict[str, Any], where: str, source: str) -> Record | str:
    """A MuSiQue item, or the skip reason ``"unanswerable"``.

    Gold paragraphs are those the decomposition points at (hop order), then any other
    ``is_supporting`` one. ``type`` is the id's prefix (``2hop``, ``3hop1``, ...), which is
    how MuSiQue names its composition shapes.
    """
    rid = _item_id(item, where)
    if not _get(item, "answerable", bool, where, default=True):
        return "unanswerable"
    question = _question(item, where)
    answer = _get(item, "answer", str, where)
    aliases = _str_list(item, "answer_aliases", where) if "answer_aliases" in item else []
    answers = list(dict.fromkeys(a.strip() for a in [answer, *aliases] if a.strip()))
    paragraphs: dict[int, tuple[str, str, bool]] = {}
    for idx, title, text, sup in _musique_paragraphs(item, where):
        if idx in paragraphs:
            raise DataError(where, f"field 'paragraphs': idx {idx} appears twice")
        paragraphs[idx] = (title, text, sup)
    decomposition = _musique_decomposition(item, paragraphs, where)
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


def _musique_decomposition(
    item: dict[str, Any], paragraphs: dict[int, tuple[str, str, bool]], where: str
) -> list[dict[str, Any]]:
    """The gold decomposition with doc ids, titles and ``#k`` references resolved.

    Each step carries a private ``_idx`` (its paragraph indices) that the caller pops.
    A ``paragraph_support_idx`` of null (allowed by the schema) gives no doc.
    """
    steps: list[dict[str, Any]] = []
    for i, d in enumerate(_get(item, "question_decomposition", list, where)):
        name = f"question_decomposition[{i}]"
        if not isinstance(d, dict):
            raise DataError(where, f"field '{name}' must be an object, got {_json_type(d)}")
        sub_q = _get(d, "question", str, where, name=f"{name}.question")
        sub_a = _get(d, "answer", (str, int, float), where, name=f"{name}.answer")
        idx = _get(d, "paragraph_support_idx", (int, type(None)), where, name=f"{name}.paragraph_support_idx")
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


def _flashrag_record(item: dict[str, Any], where: str, source: str) -> Record:
    """A FlashRAG record; its metadata is kept, ``source`` added only when absent."""
    record = Record.from_dict(item, where)
    record.metadata.setdefault("source", source)
    return record


_RECORD_READERS: dict[str, Callable[[dict[str, Any], str, str], Record | str]] = {
    "hotpotqa": _hotpot_record,
    "2wiki": _hotpot_record,
    "musique": _musique_record,
    "flashrag": _flashrag_record,
}


def load_benchmark(path: PathLike, fmt: str) -> BenchmarkLoad:
    """Read a benchmark file in its own published schema (JSONL or one JSON list).

    ``fmt`` is one of :data:`FORMATS`. HotpotQA accepts its HF and original schemas (chosen
    per item) and so reads 2Wiki files too; an item that looks like another format is refused
    with a message naming the expected fields. Skipped items are counted by reason.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown benchmark format {fmt!r}; expected one of {', '.join(FORMATS)}")
    read = _RECORD_READERS[fmt]
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
