"""Build the built-in world: configs by size, splits by world, files on disk.

Train questions come from ``train_worlds`` worlds, dev and test questions from worlds never
seen in training; ``rl_worlds`` more worlds (after the test worlds, none by default) give a few
questions each to RL alone. All worlds share the name pool (:mod:`prorag.data.world.names`) but draw
their facts independently, so the answer to a test question is never a training target and
can only be read from the test world's pages. Each world is its own retrieval partition: a
question only ever searches the pages of its own world.

Same seed and size, same bytes: every random choice comes from ``random.Random`` seeded with a
string derived from (seed, world index), and nothing depends on hash order or the clock.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorag.core.errors import DataError
from prorag.data.jsonl import write_json, write_jsonl
from prorag.data.records import Record
from prorag.data.world.audit import memorisation_audit
from prorag.data.world.documents import Granularity, render_documents
from prorag.data.world.facts import World, sample_world
from prorag.data.world.names import POOL_VERSION, YEARS, name_clusters
from prorag.data.world.questions import Question, generate_questions

GENERATOR_VERSION = 1


@dataclass
class WorldConfig:
    """How big and how hard the world is. Defaults are the ``demo`` size."""

    train_worlds: int = 20
    """Worlds whose questions are for training (facts re-drawn in each)."""
    dev_worlds: int = 1
    test_worlds: int = 1
    entities: dict[str, int] = field(default_factory=lambda: {"person": 30, "city": 14, "country": 5, "film": 16, "company": 12})
    """Entities of each type per world."""
    train_questions_per_world: int = 150
    eval_questions_per_world: int = 400
    mix: dict[str, float] = field(
        default_factory=lambda: {"chain1": 0.2, "chain2": 0.28, "chain3": 0.14, "chain4": 0.08, "which": 0.15, "same": 0.15}
    )
    """Question kinds and their weights: chain1..chain4 (bridge questions of that many hops), which, same."""
    prefix_rate: float = 0.3
    """Chance that one side of a comparison is reached through an extra hop."""
    near_duplicate_rate: float = 0.3
    """Chance that an entity's look-alike name (one letter apart) is given to another entity of its type."""
    passages: Granularity = "page"
    """``"page"``: one passage per page (an entity's intro and facts); ``"fact"``: one passage per
    sentence, titled with its page (see :func:`~prorag.data.world.documents.render_documents`)."""
    rl_worlds: int = 0
    """Extra worlds, after the test worlds, whose questions go to ``rl.jsonl`` for RL alone. Why:
    a world's facts recur across its questions, so outcome RL on a dozen worlds can raise its reward
    by learning those worlds' facts, which contradict every other world's and unlearn reading; with
    one question per world a fact pays once and only reading recurs.
    Adding them changes no other world (each world's draws are seeded by its own index)."""
    rl_questions_per_world: int = 1
    """Questions drawn from each of the ``rl_worlds``."""

    def __post_init__(self) -> None:
        check_rl_worlds(self.rl_worlds, self.rl_questions_per_world)


def check_rl_worlds(rl_worlds: int, per_world: int, prefix: str = "") -> None:
    """``rl_worlds`` >= 0 and ``rl_questions_per_world`` >= 1, else a ``ValueError`` naming both
    (``prefix``: where the fields live, e.g. ``data.`` in a pipeline config)."""
    if rl_worlds < 0 or per_world < 1:
        raise ValueError(
            f"{prefix}rl_worlds must be >= 0 and {prefix}rl_questions_per_world >= 1, got {rl_worlds} and {per_world}"
        )


SIZES: dict[str, WorldConfig] = {
    "tiny": WorldConfig(
        train_worlds=3,
        entities={"person": 10, "city": 6, "country": 3, "film": 6, "company": 5},
        train_questions_per_world=30,
        eval_questions_per_world=30,
    ),
    "demo": WorldConfig(),
    # The demo's worlds, three times as many for training: the same entity counts and question mix,
    # so a stage sees three times as many distinct facts; what a policy learns there has to be reading.
    "wide": WorldConfig(train_worlds=60),
    "large": WorldConfig(
        train_worlds=60,
        entities={"person": 60, "city": 28, "country": 8, "film": 32, "company": 24},
        train_questions_per_world=400,
        eval_questions_per_world=1000,
    ),
}


@dataclass
class WorldSummary:
    """What was built, with the memorisation audit."""

    out_dir: Path
    counts: dict[str, int]
    by_kind: dict[str, dict[str, int]]
    audit: dict[str, Any]
    seconds: float

    def describe(self) -> str:
        lines = [f"built-in world in {self.out_dir} ({self.seconds:.2f}s)"]
        lines += [f"  {k}: {v}" for k, v in self.counts.items()]
        for split, kinds in self.by_kind.items():
            lines.append(f"  {split} by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        lines.append("  no-retrieval ceiling on test (best memoriser EM vs chance):")
        for cat, row in self.audit["test"].items():
            lines.append(f"    {cat:<14} n={row['n']:<4} memoriser={row['best_memoriser_em']:.3f} chance={row['chance']:.3f}")
        return "\n".join(lines)


def world_id(index: int) -> str:
    """Partition name of the world at ``index`` (train worlds first, then dev, test and RL)."""
    return f"w{index:03d}"


def _world_rng(seed: int, index: int, purpose: str) -> random.Random:
    return random.Random(f"prorag-world-{GENERATOR_VERSION}-{seed}-{index}-{purpose}")


def to_record(q: Question, world: World, split: str, index: int) -> Record:
    """A question as a FlashRAG record; gold evidence and decomposition in metadata."""
    gold_ids: list[str] = []
    gold_titles: list[str] = []
    for hop in q.decomposition:
        for pid, title in zip(hop["doc_ids"], hop["titles"], strict=True):
            if pid not in gold_ids:
                gold_ids.append(pid)
                gold_titles.append(title)
    meta = {
        "source": "world",
        "partition": world.id,
        "split": split,
        "type": q.kind,
        "answer_kind": q.answer_kind,
        "template": q.template,
        "hops": q.hops,
        "gold_doc_ids": gold_ids,
        "gold_titles": gold_titles,
        "decomposition": q.decomposition,
    }
    return Record(f"{world.id}-q{index:04d}", q.text, [q.answer], meta)


def world_size(name: str) -> WorldConfig:
    """The settings of a named size (:data:`SIZES`); an unknown name is a ``ValueError`` listing them."""
    if name not in SIZES:
        raise ValueError(f"unknown world size {name!r}; expected one of {sorted(SIZES)}")
    return SIZES[name]


def build_world(out_dir: str | Path, seed: int = 0, size: str | WorldConfig = "demo") -> WorldSummary:
    """Generate the world and write ``corpus.jsonl``, ``train/dev/test.jsonl`` (and ``rl.jsonl``
    with ``rl_worlds``) and ``world.json``."""
    t0 = time.perf_counter()
    if isinstance(size, str):
        cfg = world_size(size)
    else:
        cfg = size
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(str(out), "is a file; expected a folder (new or existing) to write the world into")
    clusters = name_clusters()
    plan = (
        [("train", i) for i in range(cfg.train_worlds)]
        + [("dev", cfg.train_worlds + i) for i in range(cfg.dev_worlds)]
        + [("test", cfg.train_worlds + cfg.dev_worlds + i) for i in range(cfg.test_worlds)]
        + [("rl", cfg.train_worlds + cfg.dev_worlds + cfg.test_worlds + i) for i in range(cfg.rl_worlds)]
    )
    per_world = {"train": cfg.train_questions_per_world, "rl": cfg.rl_questions_per_world}
    passages = []
    splits: dict[str, list[tuple[Question, World]]] = {"train": [], "dev": [], "test": []} | ({"rl": []} if cfg.rl_worlds else {})
    worlds: dict[str, World] = {}
    for split, idx in plan:
        world = sample_world(
            world_id(idx), _world_rng(seed, idx, "facts"), cfg.entities, clusters, cfg.near_duplicate_rate, YEARS
        )
        docs = render_documents(world, _world_rng(seed, idx, "docs"), cfg.passages)
        n = per_world.get(split, cfg.eval_questions_per_world)
        questions = generate_questions(world, docs, _world_rng(seed, idx, "questions"), n, cfg.mix, cfg.prefix_rate)
        passages.extend(docs.passages)
        splits[split].extend((q, world) for q in questions)
        worlds[world.id] = world

    # No question text is shared between splits: test wins over dev, dev over train, train over RL.
    taken: set[str] = set()
    for split in ("test", "dev", "train", "rl"):
        if split in splits:
            splits[split] = [(q, w) for q, w in splits[split] if q.text not in taken]
            taken |= {q.text for q, _ in splits[split]}

    records: dict[str, list[Record]] = {}
    for split, items in splits.items():
        per_world: Counter[str] = Counter()
        recs = []
        for q, w in items:
            recs.append(to_record(q, w, split, per_world[w.id]))
            per_world[w.id] += 1
        records[split] = recs
    audit = {"test": memorisation_audit(records["train"], records["test"], worlds)}

    write_jsonl(out / "corpus.jsonl", (p.to_dict() for p in passages))
    for split, recs in records.items():
        write_jsonl(out / f"{split}.jsonl", (r.to_dict() for r in recs))
    counts = {"worlds": len(plan), "passages": len(passages), **{f"{s}_questions": len(r) for s, r in records.items()}}
    by_kind = {
        s: dict(Counter(r.metadata["type"] if r.metadata["type"] != "chain" else f"chain{r.metadata['hops']}" for r in recs))
        for s, recs in records.items()
    }
    write_json(
        out / "world.json",
        {
            "generator_version": GENERATOR_VERSION,
            "name_pool_version": POOL_VERSION,
            "seed": seed,
            "size": size if isinstance(size, str) else "custom",
            "config": dataclasses.asdict(cfg),
            "partitions": {name: [world_id(i) for s, i in plan if s == name] for name in splits},
            "counts": counts,
            "by_kind": by_kind,
            "memorisation_audit": audit,
        },
    )
    return WorldSummary(out, counts, by_kind, audit, time.perf_counter() - t0)
