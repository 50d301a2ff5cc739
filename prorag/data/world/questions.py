"""Questions of one world, each with its gold decomposition.

Three kinds, mixed by weights (see :class:`~prorag.data.world.generator.WorldConfig`):

* ``chain``: a path of 1 to 4 relations from a start entity ("Which country is the birthplace
  of the director of Tavor in?"), composed from the relations' noun phrases; each hop is one
  sub-question answered by one page.
* ``compare_which``: which of two entities has the earlier/later year ("Who was born earlier,
  Kelo or the director of Tavor?"); the answer is one of the two, so it can be guessed half
  of the time -- which is what lets an outcome-only reward credit a flawed process.
* ``compare_same``: yes/no, do two entities share a relation object ("Were Kelo and Varus born
  in the same city?"), balanced between yes and no.

Each side of a comparison may itself be reached through one extra hop, so comparisons span
2 to 4 sub-questions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from prorag.data.world.documents import WorldDocuments
from prorag.data.world.facts import RELATIONS, YEAR, Relation, World

_WHICH = {
    "birth_year": ("Who was born {cmp}, {a} or {b}?", "born"),
    "founded_year": ("Which company was founded {cmp}, {a} or {b}?", "founded"),
    "release_year": ("Which film was released {cmp}, {a} or {b}?", "released"),
}
_SAME = {
    "born_in": "Were {a} and {b} born in the same city?",
    "located_in": "Are {a} and {b} in the same country?",
    "works_for": "Do {a} and {b} work for the same company?",
    "headquartered_in": "Are {a} and {b} based in the same city?",
}


@dataclass
class Question:
    """A generated question: its text, answer and gold decomposition."""

    text: str
    answer: str
    kind: str  # chain | compare_which | compare_same
    answer_kind: str  # entity | year | which | yes_no
    decomposition: list[dict[str, Any]] = field(default_factory=list)
    template: str = ""  # relation path, e.g. "chain:directed_by>born_in" (used by the memorisation audit)

    @property
    def hops(self) -> int:
        return len(self.decomposition)


def relation_paths(length: int) -> list[tuple[Relation, ...]]:
    """All type-consistent relation paths of ``length`` hops (only the last may end in a year)."""
    paths: list[tuple[Relation, ...]] = [(r,) for r in RELATIONS.values()]
    for _ in range(length - 1):
        paths = [p + (r,) for p in paths if p[-1].object != YEAR for r in RELATIONS.values() if r.subject == p[-1].object]
    return paths


def _hop(world: World, docs: WorldDocuments, rel: Relation, subject: str) -> dict[str, Any]:
    obj = world.facts[(subject, rel.name)]
    ids = docs.fact_docs[(subject, rel.name)]
    return {
        "question": rel.render(rel.question, subject),
        "answer": obj,
        "query": rel.render(rel.query, subject),
        "relation": rel.name,
        "subject": subject,
        "doc_ids": ids[:1],
        "support_doc_ids": ids,
        "titles": [docs.titles[ids[0]]],
    }


def _walk(world: World, docs: WorldDocuments, start: str, path: tuple[Relation, ...]) -> tuple[str, list[dict[str, Any]]] | None:
    """Follow ``path`` from ``start``; return (noun phrase of the last subject, hops), or None if the path revisits an entity."""
    phrase, entity, hops, seen = start, start, [], {start}
    for i, rel in enumerate(path):
        hop = _hop(world, docs, rel, entity)
        hops.append(hop)
        entity = hop["answer"]
        if entity in seen:
            return None
        seen.add(entity)
        if i < len(path) - 1:
            phrase = rel.render(rel.phrase, phrase)
    return phrase, hops


def chain_question(world: World, docs: WorldDocuments, rng: random.Random, hops: int) -> Question | None:
    """A ``hops``-hop bridge question from a random start entity along a random path."""
    path = rng.choice(relation_paths(hops))
    start = rng.choice(world.entities[path[0].subject])
    walked = _walk(world, docs, start, path)
    if walked is None:
        return None
    phrase, decomposition = walked
    last = path[-1]
    answer = decomposition[-1]["answer"]
    text = last.render(last.question, phrase)
    return Question(
        text,
        answer,
        "chain",
        "year" if last.object == YEAR else "entity",
        decomposition,
        "chain:" + ">".join(r.name for r in path),
    )


def _side(
    world: World, docs: WorldDocuments, rng: random.Random, rel: Relation, prefix_rate: float
) -> tuple[str, str, list[dict[str, Any]]]:
    """One side of a comparison: (phrase, entity, hops to reach it), via one extra hop at ``prefix_rate``."""
    prefixes = [r for r in RELATIONS.values() if r.object == rel.subject]
    if prefixes and rng.random() < prefix_rate:
        pre = rng.choice(prefixes)
        start = rng.choice(world.entities[pre.subject])
        hop = _hop(world, docs, pre, start)
        return pre.render(pre.phrase, start), hop["answer"], [hop]
    entity = rng.choice(world.entities[rel.subject])
    return entity, entity, []


def which_question(world: World, docs: WorldDocuments, rng: random.Random, prefix_rate: float) -> Question | None:
    """Which of two entities has the earlier (or later) year."""
    rel_name = rng.choice(sorted(_WHICH))
    rel = RELATIONS[rel_name]
    template, _ = _WHICH[rel_name]
    pa, ea, ha = _side(world, docs, rng, rel, prefix_rate)
    pb, eb, hb = _side(world, docs, rng, rel, prefix_rate)
    ya, yb = world.facts[(ea, rel_name)], world.facts[(eb, rel_name)]
    if ea == eb or ya == yb or pa == pb:
        return None
    cmp = rng.choice(("earlier", "later"))
    answer = (ea if ya < yb else eb) if cmp == "earlier" else (ea if ya > yb else eb)
    decomposition = ha + [_hop(world, docs, rel, ea)] + hb + [_hop(world, docs, rel, eb)]
    text = template.format(cmp=cmp, a=pa, b=pb)
    return Question(text, answer, "compare_which", "which", decomposition, f"which:{rel_name}:{cmp}")


def same_question(world: World, docs: WorldDocuments, rng: random.Random, prefix_rate: float) -> Question | None:
    """Do two entities share the object of a relation (yes/no, drawn to be balanced)."""
    rel_name = rng.choice(sorted(_SAME))
    rel = RELATIONS[rel_name]
    pa, ea, ha = _side(world, docs, rng, rel, prefix_rate)
    want_yes = rng.random() < 0.5
    target = world.facts[(ea, rel_name)]
    pool = [s for s in world.entities[rel.subject] if s != ea and (world.facts[(s, rel_name)] == target) == want_yes]
    if not pool:
        return None
    eb = rng.choice(pool)
    pb, hb = eb, []
    # Reach b through a prefix hop too, when one leads to it.
    prefixes = [r for r in RELATIONS.values() if r.object == rel.subject]
    if prefixes and rng.random() < prefix_rate:
        pre = rng.choice(prefixes)
        starts = world.subjects_with(pre.name, eb)
        if starts:
            start = rng.choice(starts)
            pb, hb = pre.render(pre.phrase, start), [_hop(world, docs, pre, start)]
    if pa == pb:
        return None
    decomposition = ha + [_hop(world, docs, rel, ea)] + hb + [_hop(world, docs, rel, eb)]
    text = _SAME[rel_name].format(a=pa, b=pb)
    return Question(text, "yes" if want_yes else "no", "compare_same", "yes_no", decomposition, f"same:{rel_name}")


def generate_questions(
    world: World, docs: WorldDocuments, rng: random.Random, n: int, mix: dict[str, float], prefix_rate: float
) -> list[Question]:
    """Draw ``n`` distinct questions; ``mix`` weighs ``chain1``..``chain4``, ``which`` and ``same``."""
    kinds = sorted(mix)
    weights = [mix[k] for k in kinds]
    out: list[Question] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n and attempts < 200 * n:
        attempts += 1
        kind = rng.choices(kinds, weights)[0]
        if kind.startswith("chain"):
            q = chain_question(world, docs, rng, int(kind[len("chain") :]))
        elif kind == "which":
            q = which_question(world, docs, rng, prefix_rate)
        elif kind == "same":
            q = same_question(world, docs, rng, prefix_rate)
        else:
            raise ValueError(f"unknown question kind {kind!r} in the mix (expected chain1..chain4, which, same)")
        if q is None or q.text in seen or q.answer in q.text and q.kind == "chain":
            continue
        seen.add(q.text)
        out.append(q)
    return out
