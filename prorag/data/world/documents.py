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


def render_documents(world: World, rng: random.Random) -> WorldDocuments:
    """Write the pages of ``world``; sentence order (after the intro) is drawn from ``rng``."""
    sentences: dict[tuple[str, str], list[str]] = defaultdict(list)  # (entity, page) -> sentences
    fact_docs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (subject, rel_name), obj in world.facts.items():
        rel = RELATIONS[rel_name]
        sentences[(subject, rel.doc)].append(rel.render(rel.fact, subject, obj))
        fact_docs[(subject, rel_name)].append(doc_id(world.id, subject, rel.doc))
    for rel_name, template in _INVERSE.items():
        rel = RELATIONS[rel_name]
        page = _INVERSE_PAGE.get(rel_name, "main")
        for obj in world.entities[rel.object]:
            subjects = world.subjects_with(rel_name, obj)
            if not subjects:
                continue
            sentences[(obj, page)].append(template.format(o=obj, list=_join(subjects)))
            for s in subjects:
                fact_docs[(s, rel_name)].append(doc_id(world.id, obj, page))

    passages: list[Passage] = []
    titles: dict[str, str] = {}
    for etype, names in world.entities.items():
        for name in names:
            for page in ("main", "career") if etype == "person" else ("main",):
                body = list(sentences.get((name, page), []))
                rng.shuffle(body)
                intro = _INTRO[etype].format(s=name) if page == "main" else f"This page is about the career of {name}."
                pid, title = doc_id(world.id, name, page), doc_title(name, page)
                text = " ".join([intro, *body])
                passages.append(Passage(pid, f"{title}\n{text}", partition=world.id))
                titles[pid] = title
    return WorldDocuments(passages, dict(fact_docs), titles)
