"""Gold trajectories: the template teacher quotes the retrieved evidence of each sub-answer."""

from __future__ import annotations

from prorag.agent.gold import Hop, TemplateTeacher, evidence_sentence, gold_hops
from prorag.data.records import Record
from prorag.retrieval.base import Hit


def hit(title: str, text: str, i: int = 0) -> Hit:
    return Hit(id=f"d{i}", contents=f"{title}\n{text}", score=1.0)


HITS = [
    hit("Vusal", "Vusal is a company. Vusal produced Pazar and Dolar. Vusal was founded in 1986.", 0),
    hit("Pazar", "Pazar is a film. Pazar was produced by Vusal. Pazar was released in 1999.", 1),
]


def test_prefers_the_sentence_that_names_the_subject_before_the_answer() -> None:
    # "Vusal produced Pazar" comes first in rank order but names the answer before the subject.
    assert evidence_sentence(HITS, "Vusal", subject="Pazar") == "Pazar was produced by Vusal."
    # Without a subject: the first sentence, in rank order, holding the answer as a whole word.
    assert evidence_sentence(HITS, "Vusal") == "Vusal is a company."
    assert evidence_sentence(HITS, "1999") == "Pazar was released in 1999."


def test_whole_words_case_insensitive_and_none_when_absent() -> None:
    hits = [hit("T", "The Vusalian era began. A vusal company was founded.")]
    assert evidence_sentence(hits, "Vusal") == "A vusal company was founded."
    assert evidence_sentence(hits, "Kothir") is None
    assert evidence_sentence(hits, "  ") is None


def test_never_quotes_a_tag_or_an_overlong_sentence() -> None:
    hits = [hit("T", "It says <answer> Vusal. " + " ".join(["word"] * 70) + " Vusal.")]
    assert evidence_sentence(hits, "Vusal") is None


def test_template_conclusions_quote_evidence_or_say_it_is_missing() -> None:
    record = Record("q", "When was Pazar released?", ["1999"])
    hops = [Hop(question="When was Pazar released?", query="Pazar released", answer="1999", doc_ids=["d1"], subject="Pazar")]
    teacher = TemplateTeacher()
    assert teacher.conclude_thought(record, hops, 0, HITS) == "Pazar was released in 1999."
    missing = teacher.conclude_thought(record, hops, 0, HITS[:1])
    assert "do not say" in missing and "1999" in missing


def test_hops_keep_subject_and_plain_musique_relations() -> None:
    record = Record(
        "m",
        "q",
        ["x"],
        {"decomposition": [{"question": "Van Hook Township >> located in", "answer": "Ohio", "subject": None}]},
    )
    (hop,) = gold_hops(record)
    assert hop.question == hop.query == "Van Hook Township located in" and hop.subject is None
