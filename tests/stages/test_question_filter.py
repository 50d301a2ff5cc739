"""Screening the RL questions by the initial policy's pass rate (``question_filter: mixed``): the
kept questions are exactly those whose samples disagree, a question's samples do not depend on
the chunking, a resumed screening re-samples nothing, ``keep`` stops it early, and the RL stage
trains on the kept questions only."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.trajectory import Trajectory
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import Record, read_records
from prorag.method.rewards import outcome
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages import question_filter, rl
from prorag.stages.question_filter import SCREENING_STEP, mixed_questions, screen_questions, stratum_quotas
from prorag.stages.rl import RLConfig, row_seed, train_rl

pytestmark = pytest.mark.usefixtures("one_thread")

ROLLOUT = RolloutConfig(max_action_tokens=4, max_actions=1, max_completion_tokens=8, batch_size=64)


def parity_answer(trajectory: Trajectory, tokenizer: Any) -> str:
    """A stand-in answer reader: ``yes`` when the first sampled token id is odd. An untrained
    model writes no answer tag, so the real reader would find every sample wrong."""
    return "yes" if trajectory.completion_ids[0] % 2 else "no"


@pytest.fixture
def records(tiny_world: Path, monkeypatch: pytest.MonkeyPatch) -> list[Record]:
    monkeypatch.setattr(outcome, "trajectory_answer", parity_answer)
    # Questions 0 and 3 can never be answered right: their groups always agree (all wrong).
    golds = [["never"] if i in (0, 3) else ["yes"] for i in range(8)]
    return [replace(r, golden_answers=g) for r, g in zip(read_records(tiny_world / "train.jsonl")[:8], golds, strict=True)]


class CountingEngine(RolloutEngine):
    """The rollout engine, counting the rows it samples."""

    rows = 0

    def rollout(self, records: Any, **kw: Any) -> list[Trajectory]:
        CountingEngine.rows += len(records)
        return super().rollout(records, **kw)


@dataclass
class World:
    """The tiny world's tokenizer and retriever, the two things every screening here needs."""

    tokenizer: Any
    retriever: BM25Retriever


@pytest.fixture
def world(world_tokenizer: Any, tiny_retriever: BM25Retriever) -> World:
    return World(world_tokenizer, tiny_retriever)


def screen(records: list[Record], world: World, **kw: Any) -> list[Record]:
    model = make_tiny_model(world.tokenizer, seed=0)
    return screen_questions(
        records,
        model,
        world.tokenizer,
        world.retriever,
        ROLLOUT,
        group_size=4,
        sample_seed=functools.partial(row_seed, 3, SCREENING_STEP),
        progress=False,
        **kw,
    )


def test_mixed_questions_hand_computed() -> None:
    assert mixed_questions([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0]]) == [True, False, False, True]
    assert mixed_questions([]) == []


def test_screening_keeps_the_disagreeing_questions_and_resumes(
    tmp_path: Path, records: list[Record], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("prorag.agent.rollout.RolloutEngine", CountingEngine)  # imported where the screening runs
    path = tmp_path / "screening.jsonl"
    kept = screen(records, world, path=path)
    rows = list(read_jsonl(path))
    assert [r["id"] for r in rows] == [r.id for r in records]
    assert all(len(r["em"]) == 4 and set(r["em"]) <= {0.0, 1.0} for r in rows)
    mixed = [r["id"] for r in rows if 0 < sum(r["em"]) < 4]
    assert [r["kept"] for r in rows] == [r["id"] in mixed for r in rows]
    assert [r.id for r in kept] == mixed
    assert records[0].id not in mixed and records[3].id not in mixed
    assert len(mixed) >= 3, "the parity answers should make most answerable groups mixed"
    assert CountingEngine.rows == 4 * len(records)

    # Chunking changes nothing: each sample's stream is keyed by (question, sample).
    again = tmp_path / "chunked.jsonl"
    screen(records, world, path=again, chunk_questions=3)
    assert list(read_jsonl(again)) == rows

    # A resumed screening samples only the questions missing from the file.
    write_jsonl(path, rows[:5])
    CountingEngine.rows = 0
    assert [r.id for r in screen(records, world, path=path)] == mixed
    assert CountingEngine.rows == 4 * (len(records) - 5)
    assert list(read_jsonl(path)) == rows

    # Rows sampled under another key (another policy or setting) are not reused.
    CountingEngine.rows = 0
    screen(records, world, path=path, key="other")
    assert CountingEngine.rows == 4 * len(records)

    # `keep` stops at the chunk where enough questions are kept.
    first = screen(records, world, path=tmp_path / "one.jsonl", chunk_questions=1, keep=1)
    assert [r.id for r in first] == mixed[:1]
    assert len(list(read_jsonl(tmp_path / "one.jsonl"))) == [r.id for r in records].index(mixed[0]) + 1


def test_stratum_quotas_by_largest_remainder() -> None:
    # shares 5/10, 3/10, 2/10 of 4: exact 2.0, 1.2, 0.8 -> floors 2, 1, 0; the one left goes to c (0.8)
    labels = ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    assert stratum_quotas(labels, 4) == {"a": 2, "b": 1, "c": 1}
    # 3 strata of 1 each, 2 slots: remainders all 2/3 -> the first two seen get them
    assert stratum_quotas(["y", "x", "z"], 2) == {"y": 1, "x": 1, "z": 0}
    assert sum(stratum_quotas(labels, 7).values()) == 7 and stratum_quotas([], 3) == {}
    with pytest.raises(ValueError, match="total must be >= 0"):
        stratum_quotas(labels, -1)


def test_strata_hold_the_kept_questions_to_the_pool_shares(
    tmp_path: Path, records: list[Record], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "screening.jsonl"
    mixed = [r.id for r in screen(records, world, path=path)]
    assert len(mixed) >= 4
    # Label the first two mixed questions "guess" and everything else "chain": a pool of 2 guess
    # and 6 chain questions gives keep=4 the quotas guess 1, chain 3.
    strata = ["guess" if r.id in mixed[:2] else "chain" for r in records]
    kept = [r.id for r in screen(records, world, path=path, keep=4, strata=strata)]
    assert kept == [mixed[0], *[q for q in mixed if q not in mixed[:2]][:3]]
    # Unstratified, the first four mixed questions (both guesses) would have been kept.
    assert [r.id for r in screen(records, world, path=path, keep=4)] == mixed[:4] != kept
    # A stratum with too few mixed questions leaves its quota short: nothing else fills it.
    few = ["guess" if r.id in mixed[:1] else "chain" for r in records]
    assert stratum_quotas(few, 8) == {"chain": 7, "guess": 1}
    assert len(screen(records, world, path=path, keep=8, strata=few)) == len(mixed)
    with pytest.raises(ValueError, match="one label per record, got 7 labels for 8 records"):
        screen(records, world, path=path, keep=4, strata=strata[:-1])
    with pytest.raises(ValueError, match="strata needs keep"):
        screen(records, world, path=path, strata=strata)


def test_rl_trains_on_the_screened_questions_only(
    tmp_path: Path, records: list[Record], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    original = rl.EngineRollout.__call__

    def recording(self: rl.EngineRollout, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        seen.extend(prompts)
        return original(self, prompts, trainer)

    monkeypatch.setattr(rl.EngineRollout, "__call__", recording)
    cfg = RLConfig(
        group_size=4,
        per_device_batch_size=8,
        rollout=ROLLOUT,
        learning_rate=1e-3,
        max_steps=1,
        save_steps=1,
        seed=3,
        process_reward="none",
        question_filter="mixed",
        limit=2,
    )
    model = make_tiny_model(world.tokenizer, seed=0)
    train_rl(cfg, tmp_path, model=model, tokenizer=world.tokenizer, records=records, retriever=world.retriever)
    rows = list(read_jsonl(tmp_path / "screening.jsonl"))
    kept = [r["id"] for r in rows if r["kept"]][:2]
    assert len(kept) == 2 and records[0].id not in kept  # not the first `limit` questions
    questions = {r.id: r.question for r in records}
    assert sorted(set(seen)) == sorted({questions[i] for i in kept})
    with pytest.raises(ValueError, match="question_filter must be one of"):
        RLConfig(question_filter="easy")
    with pytest.raises(ValueError, match="screening_strata needs"):
        RLConfig(screening_strata="type", question_filter="mixed")  # no limit: no quotas
    assert rl.screening_strata([replace(records[0], metadata={"type": "chain"}), records[1]], "type")[0] == "chain"
    with pytest.raises(ValueError, match="no RL question has metadata field 'tpye'"):  # the stage reads the field
        train_rl(
            replace(cfg, screening_strata="tpye"),
            tmp_path / "typo",
            model=model,
            tokenizer=world.tokenizer,
            records=records,
            retriever=world.retriever,
        )


def test_screening_key_follows_the_weights_not_the_path(tmp_path: Path, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """One policy by a relative and an absolute path shares its screening rows; a policy retrained
    in place, another seed or another G does not."""
    from prorag.models.checkpoints import save_checkpoint
    from prorag.stages.rl import screening_key

    save_checkpoint(make_tiny_model(world.tokenizer, seed=0), world.tokenizer, tmp_path / "policy")
    monkeypatch.chdir(tmp_path)
    key = screening_key(RLConfig(policy=str(tmp_path / "policy")))
    assert screening_key(RLConfig(policy="policy")) == key
    assert screening_key(RLConfig(policy="policy", seed=1)) != key
    assert screening_key(RLConfig(policy="policy", group_size=4)) != key
    save_checkpoint(make_tiny_model(world.tokenizer, seed=1), world.tokenizer, tmp_path / "policy")
    assert screening_key(RLConfig(policy="policy")) != key, "retrained in place: screened again"


def test_screening_rows_keyed_before_the_rollouts_scheduling_settings_are_reused(
    tmp_path: Path, records: list[Record], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows an earlier version wrote (its key hashed the rollout settings without ``decode_graphs``,
    ``resume_early`` and ``compile_decode``) are the rows these defaults sample: reused, not screened again; a
    setting that changes what is sampled still gets a key no earlier row has."""
    import dataclasses
    import hashlib
    import json

    from prorag.stages.rl import screening_key, screening_keys

    config = RLConfig(policy=None, seed=3)
    keys = screening_keys(config)
    assert keys[0] == screening_key(config) and len(keys) == len(set(keys)) == 4
    rollout = dataclasses.asdict(config.rollout)
    # (`backend` and its `vllm` block came later still, and never enter the key: screening samples on hf.)
    old_rollout = {
        k: v for k, v in rollout.items() if k not in ("decode_graphs", "resume_early", "compile_decode", "backend", "vllm")
    }
    what = {"policy": None, "seed": 3, "group_size": config.group_size, "rollout": old_rollout}
    old_key = hashlib.blake2b(json.dumps(what, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    assert keys[-1] == old_key, "the key a version before the three settings wrote"
    hotter = RLConfig(policy=None, seed=3, rollout=dataclasses.replace(config.rollout, temperature=0.7))
    assert not set(screening_keys(hotter)) & set(keys)

    monkeypatch.setattr("prorag.agent.rollout.RolloutEngine", CountingEngine)  # imported where the screening runs
    path = tmp_path / "screening.jsonl"
    kept = screen(records, world, path=path, key=old_key)
    CountingEngine.rows = 0
    assert screen(records, world, path=path, key=keys[0], earlier_keys=keys[1:]) == kept
    assert CountingEngine.rows == 0, "rows under an earlier key of the same settings are reused"
    assert screen(records, world, path=path, key=keys[0]) == kept
    assert CountingEngine.rows == 4 * len(records), "without the earlier keys every question is screened again"
