"""The question splits of a run (``RUN/splits/``), cut once by seed: :func:`plan_splits`.

SFT's questions and the later stages' are disjoint: a model answers its own training questions
right in every sample, which leaves RFT and GRPO no signal. By default whole units (built-in worlds,
or distinct question texts for real data) are dealt to SFT+RFT, MCTS/PRM and RL, so that RL trains on
held-out queries; training questions whose text is a dev or test question are dropped. ``pool``
keeps the old layout (the later stages' questions are prefixes of one pool) to reproduce earlier runs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorag.data.jsonl import write_jsonl
from prorag.data.records import Record
from prorag.experiments.pipeline.config import DataConfig, SplitMode


def write_records(path: Path, records: Sequence[Record]) -> None:
    write_jsonl(path, (r.to_dict() for r in records))


def split_questions(records: Sequence[Record], sft_fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """Shuffle the training questions with ``seed`` and cut them into the SFT questions and the
    pool of the later stages (disjoint; the same seed gives the same split)."""
    order = list(records)
    random.Random(f"prorag-split-{seed}").shuffle(order)
    cut = round(len(order) * sft_fraction)
    return order[:cut], order[cut:]


def question_key(question: str) -> str:
    """A question as the splits compare them: lower case, spacing folded, so that two records
    asking the same question count as one question."""
    return " ".join(question.lower().split())


def split_unit(record: Record, mode: SplitMode) -> str:
    """What goes to one split as a whole: the record's world (``worlds``: its retrieval partition)
    or its question text (``questions``: records asking the same question stay together)."""
    if mode != "worlds":
        return question_key(record.question)
    if record.partition is None:
        raise ValueError(
            f"data.split: worlds needs every training record's metadata.partition (its world); record {record.id!r} "
            "has none (real data: use data.split: questions)"
        )
    return record.partition


def share_counts(units: int, sft_share: float, mcts_share: float) -> tuple[int, int, int]:
    """How many of ``units`` shuffled units go to (SFT and RFT, MCTS and PRM, RL): MCTS and RL
    get their shares rounded but at least one each, SFT the rest, so that a three-world world
    still has every split; fewer units than three cannot be split.

    >>> share_counts(20, 0.6, 0.2), share_counts(3, 0.6, 0.2)
    ((12, 4, 4), (1, 1, 1))
    """
    mcts = max(1, round(units * mcts_share))
    rl = max(1, round(units * (1.0 - sft_share - mcts_share)))
    if units - mcts - rl < 1:
        raise ValueError(f"data.split: {units} training worlds or questions cannot give SFT, MCTS and RL one each")
    return units - mcts - rl, mcts, rl


def _shuffled(items: Sequence[Any], seed: int, purpose: str) -> list[Any]:
    out = list(items)
    random.Random(f"prorag-split-{seed}-{purpose}").shuffle(out)
    return out


def _cut_by_question(records: Sequence[Record], count: int) -> tuple[list[Record], list[Record]]:
    """The records of the first ``count`` distinct questions (in the order given) and the rest."""
    first = set(list(dict.fromkeys(question_key(r.question) for r in records))[:count])
    return [r for r in records if question_key(r.question) in first], [
        r for r in records if question_key(r.question) not in first
    ]


@dataclass
class Splits:
    """The question files of a run (``sft``, ``rft``, ``mcts``, ``rl``, ``dev``, ``test``; ``pool``
    in the old layout) and ``splits/manifest.json``'s content."""

    records: dict[str, list[Record]]
    manifest: dict[str, Any]


def plan_splits(
    train: Sequence[Record],
    dev: Sequence[Record] | None,
    test: Sequence[Record],
    data: DataConfig,
    seed: int,
    rl: Sequence[Record] | None = None,
) -> Splits:
    """Cut the training questions into the stages' splits (``data.split_mode``).

    ``worlds`` and ``questions``: the units (worlds, or distinct question texts) are
    shuffled with ``seed`` and dealt to SFT+RFT, MCTS/PRM and RL by :func:`share_counts`, so no
    RL question shares a world with an SFT, RFT, MCTS or PRM question: RL trains on held-out
    queries, as in the paper, and pi_rft has not been fine-tuned on its own answers to them.
    RFT takes the SFT worlds' questions SFT did not train on (``1 - sft_fraction``), not worlds
    of its own: RFT refines pi_sft on the distribution it was trained for, and every world it
    would take is one fewer for RL and MCTS. Training questions whose text is a dev or test
    question are dropped. ``dev=None`` (real data without a dev file) carves ``dev_questions``
    from the training questions first. ``pool``: the old layout (MCTS, RFT and RL questions are
    prefixes of one pool), to reproduce earlier runs.

    ``rl`` (the built-in world's ``rl.jsonl``, ``data.rl_worlds``): RL's questions come from these
    worlds, built for RL alone, instead of the RL share of the training worlds. That share is
    still dealt, and left unused, so that every other split is the one it would be without them;
    RL questions whose text another split holds are dropped.
    """
    mode = data.split_mode
    if rl is not None and mode != "worlds":
        raise ValueError(f"RL worlds (data.rl_worlds) need data.split: worlds, got {mode!r}")
    if mode == "pool":
        sft, pool = split_questions(train, data.sft_fraction, seed)
        records = {
            "sft": sft,
            "pool": pool,
            "mcts": pool[: data.mcts_questions],
            "rft": pool[: data.rft_questions] if data.rft_questions else pool,
            "rl": pool[: data.rl_questions] if data.rl_questions else pool,
            "dev": list(dev if dev is not None else test)[: data.dev_questions],
        }
        manifest: dict[str, Any] = {}
    else:
        held = {question_key(r.question) for r in [*(dev or []), *test]}
        clean = [r for r in train if question_key(r.question) not in held]
        manifest = {"dropped_as_dev_or_test": len(train) - len(clean)}
        if dev is None:
            dev, clean = _cut_by_question(_shuffled(clean, seed, "dev"), data.dev_questions)
        by_unit: dict[str, list[Record]] = {}
        for r in clean:
            by_unit.setdefault(split_unit(r, mode), []).append(r)
        units = _shuffled(sorted(by_unit), seed, mode)
        n_sft, n_mcts, _ = share_counts(len(units), data.sft_share, data.mcts_share)
        groups = {"sft": units[:n_sft], "mcts": units[n_sft : n_sft + n_mcts], "rl": units[n_sft + n_mcts :]}
        pools = {name: _shuffled([r for u in group for r in by_unit[u]], seed, name) for name, group in groups.items()}
        sft, rft = _cut_by_question(
            pools["sft"], round(len({question_key(r.question) for r in pools["sft"]}) * data.sft_fraction)
        )
        records = {
            "sft": sft,
            "rft": rft[: data.rft_questions] if data.rft_questions else rft,
            "mcts": pools["mcts"][: data.mcts_questions],
            "rl": pools["rl"],
            "dev": list(dev)[: data.dev_questions],
        }
        rl_units = groups["rl"]  # RL's worlds: the RL share's, or with `rl` those its questions come from
        if rl is not None:
            taken = held | {question_key(r.question) for r in [*sft, *rft, *pools["mcts"]]}
            kept = [r for r in rl if question_key(r.question) not in taken]
            manifest["rl_worlds"] = {
                "questions": len(rl),
                "dropped_as_other_split": len(rl) - len(kept),
                "unused_train_worlds": sorted(groups["rl"]),
            }
            records["rl"] = _shuffled(kept, seed, "rl")
            rl_units = sorted({r.partition or "" for r in kept})
        if data.rl_questions:
            records["rl"] = records["rl"][: data.rl_questions]
        if mode == "worlds":
            manifest["worlds"] = {name: sorted(groups[name]) for name in ("sft", "mcts")} | {
                "rl": sorted(rl_units),
                "rft": sorted(groups["sft"]),
            }
    records["test"] = list(test)[: data.test_questions] if data.test_questions else list(test)
    if mode == "worlds":
        manifest.setdefault("worlds", {}).update({s: sorted({r.partition or "" for r in records[s]}) for s in ("dev", "test")})
    return Splits(records, {"split": mode, "seed": seed, "counts": {k: len(v) for k, v in records.items()}, **manifest})
