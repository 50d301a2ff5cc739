"""Hand-made corpora shared by the retrieval tests.

* ``plain``: ten unrelated encyclopedia-style passages, no partitions (like a real corpus);
* ``worlds``: two parallel worlds sharing the names Zorvan, Meldria and Ost, each in its own
  partition. World B's passage about Zorvan matches the isolation query better than
  anything in world A, so a leak from B into a query scoped to A would show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.data.jsonl import write_jsonl
from prorag.data.records import Passage

PLAIN = [
    ("Marie Curie", "Marie Curie was a physicist and chemist who conducted pioneering research on radioactivity."),
    (
        "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, France, designed by the company of Gustave Eiffel.",
    ),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge volume of water in the world."),
    ("Python (programming language)", "Python is a high-level programming language created by Guido van Rossum."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, located in the Himalayas."),
    (
        "Photosynthesis",
        "Photosynthesis is the process by which plants convert light energy into chemical energy stored in glucose.",
    ),
    (
        "Great Wall of China",
        "The Great Wall of China is a series of fortifications built across the northern borders of ancient Chinese states.",
    ),
    ("Violin", "The violin is a wooden string instrument, the smallest and highest-pitched member of its family."),
    ("Wolfgang Amadeus Mozart", "Mozart was a prolific composer of the Classical period, born in Salzburg in 1756."),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System, a gas giant."),
]

WORLDS = [
    ("A", "Zorvan", "Zorvan is the capital of Meldria and lies on the Ost."),
    ("A", "Meldria", "Meldria is a kingdom ruled by queen Tavi from Zorvan."),
    ("A", "Ost", "The Ost is a slow river that floods every spring."),
    ("B", "Zorvan", "Zorvan is a harbour town of Quennar, the capital of Quennar's fishing trade."),
    ("B", "Meldria", "Meldria is a desert where nobody has lived for centuries."),
    ("B", "Quennar", "Quennar is a republic whose capital is Ost."),
]


def _plain() -> list[Passage]:
    return [Passage.from_title_text(t, x) for t, x in PLAIN]


def _worlds() -> list[Passage]:
    return [Passage.from_title_text(t, x, partition=p) for p, t, x in WORLDS]


# Session-scoped so that module-scoped fixtures (a dense retriever loads a model) can use
# them; the lists are shared, so tests build new lists rather than modify them.


@pytest.fixture(scope="session")
def plain() -> list[Passage]:
    return _plain()


@pytest.fixture(scope="session")
def worlds() -> list[Passage]:
    return _worlds()


@pytest.fixture(scope="session")
def mixed() -> list[Passage]:
    """Plain passages (no partition) and both worlds in one corpus."""
    return _plain() + _worlds()


@pytest.fixture(scope="session")
def mixed_corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``mixed`` corpus as a JSONL file (shared by several tests: do not modify it)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_jsonl(path, (p.to_dict() for p in _plain() + _worlds()))
    return path
