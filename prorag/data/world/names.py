"""The fixed vocabulary of the built-in world: one pool of names shared by every world.

Why a fixed, shared pool: a probe showed that a tiny model trained on worlds whose names are
freshly invented (and split into several sub-word tokens) memorises instead of reading and
fails on an unseen world, while with names drawn from one fixed pool, each a single token of the
world tokenizer, and facts re-drawn per world, it learns to copy answers from the retrieved text
and answers most questions of an unseen world. The same name therefore means different things in
different worlds, and the only way to answer is to read.

Names are short pronounceable pseudo-words (never English words, so BM25 and the tokenizer
treat each as one rare term). Every base name has near-duplicate variants that differ in one
letter ("Tavor", "Tavir"): a world gives some of them to entities of the same type, as
distractors that a careless reader confuses. The pool is generated from a fixed seed, so it is
identical on every machine and in every world; changing it changes every world (bump
``POOL_VERSION``).
"""

from __future__ import annotations

import random
from functools import cache

POOL_VERSION = "v1"
POOL_SIZE = 600  # names in the pool (bases and their variants)
YEARS: tuple[str, ...] = tuple(str(y) for y in range(1900, 2000))

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "r", "s", "t", "th", "v", "z", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ia")
_MIDS = ("l", "n", "r", "v", "m", "d", "s", "k", "th", "z", "nd", "rv")
_CODAS = ("", "n", "r", "s", "th", "x", "l", "k")


def _candidate(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_MIDS) + rng.choice(_VOWELS[:5]) + rng.choice(_CODAS)


def _variant(name: str, rng: random.Random) -> str:
    """A near-duplicate: the last vowel of ``name`` replaced by another vowel."""
    idx = max(i for i, c in enumerate(name) if c in "aeiou")
    options = [v for v in "aeiou" if v != name[idx]]
    return name[:idx] + rng.choice(options) + name[idx + 1 :]


def _looks_foreign(name: str) -> bool:
    """Keep names of 5-8 letters that do not end in a silent-looking "e".

    Short names and names ending in "e" are the ones that collide with English words
    ("tile", "dune"), which would blur the line between world facts and language.
    """
    return 5 <= len(name) <= 8 and not name.endswith("e")


@cache
def name_clusters() -> tuple[tuple[str, ...], ...]:
    """The pool as clusters of near-duplicate names (a base and one or two variants)."""
    rng = random.Random(f"prorag-world-names-{POOL_VERSION}")
    seen: set[str] = set()
    clusters: list[tuple[str, ...]] = []
    total = 0
    while total < POOL_SIZE:
        base = _candidate(rng)
        if base in seen or not _looks_foreign(base):
            continue
        cluster = [base]
        for _ in range(rng.choice((1, 2))):
            v = _variant(base, rng)
            if v not in seen and v not in cluster and _looks_foreign(v):
                cluster.append(v)
        seen.update(cluster)
        clusters.append(tuple(n.capitalize() for n in cluster))
        total += len(cluster)
    return tuple(clusters)


@cache
def name_pool() -> tuple[str, ...]:
    """Every name of the pool, in a fixed order."""
    return tuple(n for cluster in name_clusters() for n in cluster)


#: The answers of yes/no questions. Single tokens like names and years: split into " y" + "es",
#: the first token of every yes/no answer would be a bare space, which a model that is unsure of
#: a name then prefers to any single name under greedy decoding.
ANSWER_WORDS: tuple[str, ...] = ("yes", "no")


def world_vocabulary() -> tuple[str, ...]:
    """Atomic values a world tokenizer should keep as single tokens: names, years, yes and no."""
    return name_pool() + YEARS + ANSWER_WORDS
