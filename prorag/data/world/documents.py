"""The encyclopedia pages of one world.

Every entity gets one page, people two (``Kelo`` and ``Kelo (career)``), so that finding the
right page for a hop matters. A fact is stated on its subject's page (its *primary* document,
which is the gold evidence of a hop) and some facts are also mentioned, inversely, on the
object's page ("Varn is home to Drumco."): true statements that share the query's names and so
compete with the gold page in retrieval. Sentences after the first are shuffled, so a reader
cannot rely on positions.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from prorag.data.records import Passage
from prorag.data.world.facts import RELATIONS, World

_INTRO = {
    "person": "{s} is a person.",
    "city": "{s} is a city.",
    "country": "{s} is a country.",
    "film": "{s} is a film.",
    "company": "{s} is a company.",
}
# Inverse mentions written on the object's page: (relation, template with {o} = page owner, {list}).
_INVERSE = {
    "directed_by": "{o} directed {list}.",
    "founded_by": "{o} founded {list}.",
    "headquartered_in": "{o} is home to {list}.",
    "located_in": "Cities of {o} include {list}.",
    "produced_by": "{o} produced {list}.",
}
# Which page of the object holds an inverse mention.
_INVERSE_PAGE = {"directed_by": "career", "founded_by": "career"}


@dataclass
class WorldDocuments:
    """A world's pages and, for every fact, the ids of the pages that state it (primary first)."""

    passages: list[Passage]
    fact_docs: dict[tuple[str, str], list[str]]
    titles: dict[str, str]


def doc_id(world_id: str, name: str, page: str = "main") -> str:
    slug = name.lower() if page == "main" else f"{name.lower()}-{page}"
    return f"{world_id}/{slug}"


def doc_title(name: str, page: str = "main") -> str:
    return name if page == "main" else f"{name} ({page})"


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


Granularity = Literal["page", "fact"]


def render_documents(world: World, rng: random.Random, granularity: Granularity = "page") -> WorldDocuments:
    """Write the pages of ``world``; sentence order (after the intro) is drawn from ``rng``.

    ``granularity="fact"`` cuts every page into one passage per sentence (ids ``PAGE/1``,
    ``PAGE/2``, ... in the page's shuffled order, each titled with its page's title; the intro
    sentence is left out): the same statements, retrieved one at a time. Like chunking a real
    corpus into sentences, it shortens what a reader must search through (three retrieved
    sentences instead of three pages of five), which is what a tiny model trained from
    scratch needs to learn to read within minutes; the gold evidence of a hop is then the
    sentence that states it.
    """
    sentences: dict[tuple[str, str], list[str]] = defaultdict(list)  # (entity, page) -> sentences
    fact_sentences: dict[tuple[str, str], list[str]] = defaultdict(list)  # (subject, relation) -> its sentences
    for (subject, rel_name), obj in world.facts.items():
        rel = RELATIONS[rel_name]
        sentence = rel.render(rel.fact, subject, obj)
        sentences[(subject, rel.doc)].append(sentence)
        fact_sentences[(subject, rel_name)].append(sentence)
    for rel_name, template in _INVERSE.items():
        rel = RELATIONS[rel_name]
        page = _INVERSE_PAGE.get(rel_name, "main")
        for obj in world.entities[rel.object]:
            subjects = world.subjects_with(rel_name, obj)
            if not subjects:
                continue
            sentence = template.format(o=obj, list=_join(subjects))
            sentences[(obj, page)].append(sentence)
            for s in subjects:
                fact_sentences[(s, rel_name)].append(sentence)

    passages: list[Passage] = []
    titles: dict[str, str] = {}
    where: dict[str, str] = {}  # sentence -> id of the passage that holds it
    for etype, names in world.entities.items():
        for name in names:
            for page in ("main", "career") if etype == "person" else ("main",):
                body = list(sentences.get((name, page), []))
                rng.shuffle(body)
                pid, title = doc_id(world.id, name, page), doc_title(name, page)
                if granularity == "fact":
                    for i, sentence in enumerate(body, 1):
                        passages.append(Passage(f"{pid}/{i}", f"{title}\n{sentence}", partition=world.id))
                        titles[f"{pid}/{i}"] = title
                        where[sentence] = f"{pid}/{i}"
                    continue
                intro = _INTRO[etype].format(s=name) if page == "main" else f"This page is about the career of {name}."
                text = " ".join([intro, *body])
                passages.append(Passage(pid, f"{title}\n{text}", partition=world.id))
                titles[pid] = title
                where.update((sentence, pid) for sentence in body)
    fact_docs = {key: [where[s] for s in found] for key, found in fact_sentences.items()}
    return WorldDocuments(passages, fact_docs, titles)
