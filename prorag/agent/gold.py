"""Gold trajectories: a record's gold decomposition written in the ProRAG format.

For every hop of the gold decomposition the trajectory searches (template thought + the hop's
search keywords), shows what **the project's retriever returns** for those keywords (never the
gold paragraph pasted in: training must see what inference will see), and concludes with the
gold sub-answer; a final action answers. When a hop's gold page is not among the retrieved
documents the trajectory still concludes with the gold sub-answer, and ``missing_gold`` records
the hop, so that a training stage can drop or down-weight such trajectories.

A trajectory is kept as **segments** that alternate between what the model writes and what the
environment writes, exactly as the rollout engine produces them: each segment is tokenised on
its own (as the engine does), so the environment mask of the training text is exact.

The thoughts come from a ``Teacher``; :class:`TemplateTeacher` (deterministic, offline) is the
default; the SFT stage adds an LLM teacher with the same interface.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prorag.agent.schema import render_answer, render_conclude, render_env_turn, render_search, step_opener
from prorag.data.records import Record
from prorag.retrieval.base import Hit, Retriever


@dataclass
class Hop:
    """One gold hop: what to ask, what to search, the gold answer and gold pages."""

    question: str
    query: str
    answer: str
    doc_ids: list[str]
    subject: str | None = None
    """The entity the hop asks about, when the decomposition names it (built-in world)."""


@dataclass
class GoldTrajectory:
    """A rendered gold trajectory as (text, written_by_model) segments."""

    id: str
    question: str
    segments: list[tuple[str, bool]]
    answer: str
    missing_gold: list[int] = field(default_factory=list)
    """Hops whose gold page the retriever did not return."""
    retrievals: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | None = None
    """The exact prompt text, when it is not the ProRAG prompt of ``question`` (a trained
    baseline's prompt: :func:`prorag.evaluation.baselines.baseline_trajectories`)."""

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "segments": [[t, m] for t, m in self.segments],
            "answer": self.answer,
            "missing_gold": self.missing_gold,
            "retrievals": self.retrievals,
        } | ({"prompt": self.prompt} if self.prompt is not None else {})


class Teacher(Protocol):
    """Writes the thoughts of a gold trajectory."""

    def search_thought(self, record: Record, hops: Sequence[Hop], i: int) -> str: ...

    def conclude_thought(self, record: Record, hops: Sequence[Hop], i: int, hits: Sequence[Hit]) -> str: ...

    def answer_thought(self, record: Record, hops: Sequence[Hop]) -> str: ...


class TemplateTeacher:
    """Deterministic first-person thoughts built from the gold hops (no network).

    A conclusion's thought **quotes the evidence**: the retrieved sentence that states the
    sub-answer (:func:`evidence_sentence`), e.g. ``Pazar was released in 1999.`` before
    ``<subanswer> 1999 </subanswer>``. A thought that only announced the answer ("the documents
    say the answer is 1999") would make the model produce the answer with nothing to copy from
    but the documents as a whole; writing the subject and relation first lets it find the
    matching words in the retrieved text and copy what follows them, the mechanism (an
    induction head) that a tiny transformer learns first. A probe on the built-in world: with
    announced answers a tiny model rarely found its sub-answers; quoting is what lets it read.
    When no retrieved sentence holds the answer (the retriever missed the gold page) the thought
    says so.
    """

    def search_thought(self, record: Record, hops: Sequence[Hop], i: int) -> str:
        return f"I need to know: {hops[i].question}"

    def conclude_thought(self, record: Record, hops: Sequence[Hop], i: int, hits: Sequence[Hit]) -> str:
        quote = evidence_sentence(hits, hops[i].answer, hops[i].subject)
        return quote or f"The documents do not say it; I take {hops[i].answer}."

    def answer_thought(self, record: Record, hops: Sequence[Hop]) -> str:
        kind = record.metadata.get("type")
        answer = record.golden_answers[0]
        if kind == "compare_same" and len(hops) >= 2:
            a, b = hops[_first_side_end(record)].answer, hops[-1].answer
            return f"{a} and {b} are {'the same' if a == b else 'different'}, so the answer is {answer}."
        if kind == "compare_which" and len(hops) >= 2:
            i = _first_side_end(record)
            return f"{hops[i].answer} against {hops[-1].answer}, so the answer is {answer}."
        return f"So the answer is {answer}."


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_MAX_QUOTE_WORDS = 60


def evidence_sentence(hits: Sequence[Hit], answer: str, subject: str | None = None) -> str | None:
    """The retrieved sentence that states ``answer``: the first, in rank order, that contains it
    as a whole word (case-insensitive), preferring one in which ``subject`` comes before the
    answer (``Pazar was released in 1999.`` rather than ``Vusal produced Pazar.``: written
    subject first, the answer is the word a reader copies last). Sentences of more than 60
    words, or with a ``<`` (a tag-like string a thought may not hold), are not quoted. ``None``
    when no sentence qualifies.
    """
    if not answer.strip():
        return None
    want = re.compile(rf"(?<!\w){re.escape(answer.strip())}(?!\w)", re.IGNORECASE)
    found: list[str] = []
    for hit in hits:
        body = hit.contents.split("\n", 1)[1] if "\n" in hit.contents else hit.contents
        for sentence in _SENTENCE_END.split(body.strip()):
            sentence = " ".join(sentence.split())
            if "<" in sentence or len(sentence.split()) > _MAX_QUOTE_WORDS:
                continue
            m = want.search(sentence)
            if not m:
                continue
            if subject and 0 <= sentence.find(subject) < m.start():
                return sentence
            found.append(sentence)
    return found[0] if found else None


def _first_side_end(record: Record) -> int:
    """Index of the hop that ends the first side of a comparison (same relation as the last hop)."""
    decomposition = record.metadata["decomposition"]
    last = decomposition[-1].get("relation")
    return next(i for i, h in enumerate(decomposition) if h.get("relation") == last)


def gold_hops(record: Record) -> list[Hop]:
    """The record's gold decomposition as hops; [] when it has none.

    The hop's question has references resolved (MuSiQue's ``question_resolved``) and MuSiQue's
    ``>>`` relation notation turned into plain words (``"Van Hook Township >> located in"``
    becomes ``"Van Hook Township located in"``), so that neither the thoughts nor the searches
    learn the notation. Search keywords: the hop's ``query`` when given (built-in world), else
    that question.
    """
    hops = []
    for h in record.metadata.get("decomposition") or []:
        question = re.sub(r"\s*>>\s*", " ", h.get("question_resolved") or h["question"]).strip()
        query = h.get("query") or question
        hops.append(
            Hop(
                question=question,
                query=query,
                answer=str(h["answer"]),
                doc_ids=list(h.get("doc_ids") or []),
                subject=h.get("subject"),
            )
        )
    return hops


def render_gold(
    records: Sequence[Record], retriever: Retriever, *, k: int = 3, teacher: Teacher | None = None
) -> list[GoldTrajectory]:
    """Gold trajectories of every record with a decomposition (one batched search per hop level)."""
    teacher = teacher or TemplateTeacher()
    items = [(r, gold_hops(r)) for r in records]
    items = [(r, hops) for r, hops in items if hops]
    # Batch the searches of all records level by level (hop 1 of all, then hop 2, ...).
    found: dict[tuple[int, int], list[Hit]] = {}
    depth = max((len(h) for _, h in items), default=0)
    for level in range(depth):
        idx = [i for i, (_, hops) in enumerate(items) if len(hops) > level]
        results = retriever.search([items[i][1][level].query for i in idx], k=k, partitions=[items[i][0].partition for i in idx])
        for i, hits in zip(idx, results, strict=True):
            found[(i, level)] = hits
    out = []
    for i, (record, hops) in enumerate(items):
        out.append(_render_one(record, hops, [found[(i, j)] for j in range(len(hops))], teacher))
    return out


def _render_one(record: Record, hops: list[Hop], hits: list[list[Hit]], teacher: Teacher) -> GoldTrajectory:
    segments: list[tuple[str, bool]] = []
    missing: list[int] = []
    retrievals: list[dict[str, Any]] = []
    opener = step_opener()

    def model_writes(action_text: str) -> None:
        # After the first action the environment has already written the "<step>" opener.
        segments.append((action_text if not segments else action_text[len(opener) :], True))

    for j, hop in enumerate(hops):
        model_writes(render_search(teacher.search_thought(record, hops, j), hop.query))
        segments.append((render_env_turn(hits[j]), False))
        ids = [h.id for h in hits[j]]
        retrievals.append({"query": hop.query, "doc_ids": ids, "action": 2 * j})
        if hop.doc_ids and not set(hop.doc_ids) & set(ids):
            missing.append(j)
        model_writes(render_conclude(teacher.conclude_thought(record, hops, j, hits[j]), hop.answer))
        segments.append((render_env_turn(), False))
    model_writes(render_answer(teacher.answer_thought(record, hops), record.golden_answers[0]))
    return GoldTrajectory(record.id, record.question, segments, record.golden_answers[0], missing, retrievals)


def tokenize_segments(tokenizer: Any, segments: Sequence[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Token ids and env mask (1 = model-written) of a segmented completion, segment by segment."""
    ids: list[int] = []
    mask: list[int] = []
    for text, by_model in segments:
        seg = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids.extend(seg)
        mask.extend([int(by_model)] * len(seg))
    return ids, mask
