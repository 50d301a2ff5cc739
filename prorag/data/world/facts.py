"""Entities, relations and the facts of one world.

A world is a small typed knowledge graph. Every relation carries the four surface forms the
rest of the generator needs, so that documents, questions and gold decompositions always agree:

* ``fact``: the sentence a document states (``"Tavor was directed by Kelo."``);
* ``question``: the single-hop sub-question (``"Who directed Tavor?"``);
* ``phrase``: the noun phrase used to compose multi-hop questions (``"the director of Tavor"``);
* ``query``: search keywords a policy would send for that hop (``"Tavor director"``).

Facts are drawn at random per world from the world's own RNG: the same name has unrelated
facts in every other world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

ENTITY_TYPES = ("person", "city", "country", "film", "company")
YEAR = "year"


@dataclass(frozen=True)
class Relation:
    """A typed relation with its surface forms (``{s}`` is the subject, ``{o}`` the object)."""

    name: str
    subject: str
    object: str
    fact: str
    question: str
    phrase: str
    query: str
    doc: str = "main"  # which of the subject's documents states the fact

    def render(self, template: str, s: str, o: str = "") -> str:
        return template.format(s=s, o=o)


RELATIONS: dict[str, Relation] = {
    r.name: r
    for r in (
        Relation("born_in", "person", "city", "{s} was born in {o}.", "Where was {s} born?", "the birthplace of {s}", "{s} born"),
        Relation(
            "birth_year",
            "person",
            YEAR,
            "{s} was born in the year {o}.",
            "When was {s} born?",
            "the birth year of {s}",
            "{s} birth year",
        ),
        Relation(
            "works_for",
            "person",
            "company",
            "{s} works for {o}.",
            "Which company does {s} work for?",
            "the employer of {s}",
            "{s} works for",
            doc="career",
        ),
        Relation(
            "located_in",
            "city",
            "country",
            "{s} is a city in {o}.",
            "Which country is {s} in?",
            "the country of {s}",
            "{s} country",
        ),
        Relation(
            "capital",
            "country",
            "city",
            "The capital of {s} is {o}.",
            "What is the capital of {s}?",
            "the capital of {s}",
            "{s} capital",
        ),
        Relation(
            "directed_by",
            "film",
            "person",
            "{s} was directed by {o}.",
            "Who directed {s}?",
            "the director of {s}",
            "{s} director",
        ),
        Relation(
            "produced_by",
            "film",
            "company",
            "{s} was produced by {o}.",
            "Which company produced {s}?",
            "the producer of {s}",
            "{s} produced by",
        ),
        Relation(
            "release_year",
            "film",
            YEAR,
            "{s} was released in {o}.",
            "When was {s} released?",
            "the release year of {s}",
            "{s} released",
        ),
        Relation(
            "founded_by", "company", "person", "{s} was founded by {o}.", "Who founded {s}?", "the founder of {s}", "{s} founder"
        ),
        Relation(
            "headquartered_in",
            "company",
            "city",
            "{s} is based in {o}.",
            "Where is {s} based?",
            "the home city of {s}",
            "{s} based in",
        ),
        Relation(
            "founded_year",
            "company",
            YEAR,
            "{s} was founded in {o}.",
            "When was {s} founded?",
            "the founding year of {s}",
            "{s} founded year",
        ),
    )
}


def relations_from(entity_type: str) -> list[Relation]:
    """Relations whose subject is of ``entity_type``, in a fixed order."""
    return [r for r in RELATIONS.values() if r.subject == entity_type]


@dataclass
class World:
    """One world: named entities by type and the object of every (subject, relation)."""

    id: str
    entities: dict[str, list[str]]
    facts: dict[tuple[str, str], str] = field(default_factory=dict)

    def type_of(self, name: str) -> str:
        for t, names in self.entities.items():
            if name in names:
                return t
        raise KeyError(name)

    def get(self, subject: str, relation: str) -> str | None:
        return self.facts.get((subject, relation))

    def subjects_with(self, relation: str, obj: str) -> list[str]:
        """Inverse lookup: subjects whose ``relation`` points at ``obj`` (in entity order)."""
        subject_type = RELATIONS[relation].subject
        return [s for s in self.entities[subject_type] if self.facts.get((s, relation)) == obj]


def assign_names(
    rng: random.Random, counts: dict[str, int], clusters: tuple[tuple[str, ...], ...], near_duplicate_rate: float
) -> dict[str, list[str]]:
    """Give every entity a distinct name from the shared pool.

    With probability ``near_duplicate_rate`` an entity's type also receives a near-duplicate
    of its name (same cluster), so that look-alike entities of one type sit side by side.
    """
    free = [list(c) for c in clusters]
    rng.shuffle(free)
    out: dict[str, list[str]] = {t: [] for t in counts}
    for t, n in counts.items():
        names = out[t]
        while len(names) < n:
            if not free:
                raise ValueError(f"the name pool is too small for {sum(counts.values())} entities per world")
            cluster = free.pop()
            rng.shuffle(cluster)
            take = 2 if (len(cluster) > 1 and n - len(names) >= 2 and rng.random() < near_duplicate_rate) else 1
            names.extend(cluster[:take])
    return out


def sample_world(
    world_id: str,
    rng: random.Random,
    counts: dict[str, int],
    clusters: tuple[tuple[str, ...], ...],
    near_duplicate_rate: float,
    years: tuple[str, ...],
) -> World:
    """Draw a world's entities and facts.

    Every city lies in a country and every country has at least one city, whose capital is
    one of its own cities; every other relation picks its object uniformly at random.
    """
    missing = [t for t in ENTITY_TYPES if counts.get(t, 0) < 1]
    if missing:
        raise ValueError(f"a world needs at least one entity of every type; missing {missing}")
    if counts["city"] < counts["country"]:
        raise ValueError("a world needs at least as many cities as countries (every country has a city)")
    world = World(world_id, assign_names(rng, counts, clusters, near_duplicate_rate))
    ents = world.entities
    cities = list(ents["city"])
    rng.shuffle(cities)
    for i, city in enumerate(cities):  # the first cities cover every country once
        country = ents["country"][i] if i < len(ents["country"]) else rng.choice(ents["country"])
        world.facts[(city, "located_in")] = country
    for country in ents["country"]:
        world.facts[(country, "capital")] = rng.choice(world.subjects_with("located_in", country))
    for rel in RELATIONS.values():
        if rel.name in ("located_in", "capital"):
            continue
        for s in ents[rel.subject]:
            world.facts[(s, rel.name)] = rng.choice(years if rel.object == YEAR else ents[rel.object])
    return world
