"""The RFT stage: the outcome and PRM filters keep exactly the expected (context, action) pairs,
the loss mask covers only kept actions, sampling resumes chunk by chunk to the same samples, and
fine-tuning a tiny model on the kept pairs moves its weights with a finite loss."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.data.jsonl import read_jsonl
from prorag.data.records import Record, read_records
from prorag.method.losses import format_token_weights, tag_weight_table
from prorag.models.checkpoints import load_policy
from prorag.models.tags import tag_token_ids
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.rft import (
    build_rft_examples,
    chunk_seed,
    collect_rft_samples,
    count_samples,
    finetune_rft,
    is_correct,
    kept_actions,
    question_chunks,
    rft_example,
    rft_loss_mask,
    run_rft,
)
from prorag.stages.rft_config import RFTConfig
from prorag.stages.sft_config import SFTTrainingConfig
from tests.fakes import ReplayLM

pytestmark = pytest.mark.usefixtures("one_thread")


class AlternatingScorer:
    """A fake PRM: action ``i`` of a trajectory scores +1 when ``i`` is even, -1 when odd
    (searches and the answer pass, conclusions fail, in a search-conclude-answer trajectory).
    Records the ids of the trajectories it was asked to score."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        self.seen.extend(t.id for t in trajectories)
        return [[1.0 if i % 2 == 0 else -1.0 for i in range(len(t.actions))] for t in trajectories]


# ----------------------------------------------------------------------------- pure filters


def test_outcome_filter_em_and_f1() -> None:
    assert is_correct("The Paris", ["paris"]) and not is_correct("Paris France", ["Paris"])
    assert not is_correct(None, ["Paris"])
    # F1("Paris France", "Paris") = 2 * (1/2 * 1) / (1/2 + 1) = 2/3
    assert is_correct("Paris France", ["Paris"], "f1", 0.6) and not is_correct("Paris France", ["Paris"], "f1", 0.7)
    with pytest.raises(ValueError, match="correctness"):
        RFTConfig(correctness="cover")  # type: ignore[arg-type]


def test_process_filter_keeps_strictly_positive_well_formed_actions() -> None:
    acts = [ActionRecord("search", (0, 3), True), ActionRecord("conclude", (3, 5), False), ActionRecord(None, (5, 6), False)]
    assert kept_actions(acts, [0.5, 2.0, 1.0]) == [0]
    assert kept_actions(acts, [0.5, 2.0, 1.0], drop_malformed=False) == [0, 1, 2]
    assert kept_actions(acts, [0.0, 2.0, -1.0], drop_malformed=False) == [1]  # logit > 0, not >= 0
    assert kept_actions(acts, [0.5, 2.0, 1.0], threshold=0.7, drop_malformed=False) == [1, 2]
    with pytest.raises(ValueError, match="logits"):
        kept_actions(acts, [1.0])


def test_reasoning_scope_keeps_a_correct_answer_whatever_its_logit() -> None:
    acts = [ActionRecord("search", (0, 3), True), ActionRecord("conclude", (3, 5), True), ActionRecord("answer", (5, 7), True)]
    logits = [0.5, -0.2, -3.0]
    assert kept_actions(acts, logits) == [0]
    assert kept_actions(acts, logits, scope="reasoning") == [0, 2]  # the conclusion is still judged
    assert kept_actions(acts, logits, threshold=1.0, scope="reasoning") == [2]
    broken = [*acts[:2], ActionRecord("answer", (5, 7), False)]
    assert kept_actions(broken, logits, scope="reasoning") == [0]  # a malformed answer is judged, and dropped
    with pytest.raises(ValueError, match="prm_scope"):
        RFTConfig(prm_scope="answers")  # type: ignore[arg-type]


def _toy_trajectory() -> Trajectory:
    # prompt [1, 2]; completion: action 0 = [10, 11, 12], env [50, 51], action 1 = [13, 14], action 2 = [15, 16]
    return Trajectory(
        id="t",
        question="q",
        prompt_ids=[1, 2],
        completion_ids=[10, 11, 12, 50, 51, 13, 14, 15, 16],
        env_mask=[1, 1, 1, 0, 0, 1, 1, 1, 1],
        logprobs=[0.0] * 9,
        actions=[
            ActionRecord("search", (0, 3), True),
            ActionRecord("conclude", (5, 7), True),
            ActionRecord("answer", (7, 9), True),
        ],
        retrievals=[],
        stop_reason="answer",
    )


def test_counts_per_hop_count_by_hand() -> None:
    # q1 (1 hop): two samples, both right and kept. q2 (2 hops): two samples, one right, kept.
    # q3 (4 hops): two wrong samples. q4: no hop count known, so only in the totals.
    def row(q: str, correct: bool) -> dict[str, Any]:
        return {
            "question_id": q,
            "correct": correct,
            "prm_logits": [1.0] if correct else None,
            "kept_actions": [0] if correct else [],
        }

    rows = [row("q1", True), row("q1", True), row("q2", True), row("q2", False), row("q3", False), row("q3", False)]
    rows.append(row("q4", True))
    counts = count_samples(rows, {"q1": 1, "q2": 2, "q3": 4})
    assert (counts.questions, counts.samples, counts.correct, counts.trajectories_kept) == (4, 7, 4, 4)
    assert counts.by_hops == {
        "1": {"questions": 1, "samples": 2, "correct": 2, "trajectories_kept": 2},
        "2": {"questions": 1, "samples": 2, "correct": 1, "trajectories_kept": 1},
        "4": {"questions": 1, "samples": 2, "correct": 0, "trajectories_kept": 0},
    }
    assert count_samples(rows).by_hops == {}
    assert counts.describe().splitlines() == [
        "kept 4 of 7 samples (4 correct) of 4 questions; 4 of 4 scored actions",
        "  1-hop questions: 1, 2 of 2 samples correct, 2 kept",
        "  2-hop questions: 1, 1 of 2 samples correct, 1 kept",
        "  4-hop questions: 1, 0 of 2 samples correct, 0 kept",
    ]


def test_loss_mask_covers_only_the_kept_actions() -> None:
    traj = _toy_trajectory()
    assert rft_loss_mask(traj, [0, 2]) == [0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert rft_loss_mask(traj, [1]) == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert rft_loss_mask(traj, []) == [0] * 11
    # A span that (wrongly) covers environment tokens still never makes them targets.
    traj.actions[0] = ActionRecord("search", (0, 5), True)
    assert rft_loss_mask(traj, [0]) == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    ex = rft_example(_toy_trajectory(), [0, 2], {12: 3.0, 16: 5.0}, "t#0")
    assert ex["id"] == "t#0" and ex["input_ids"] == [1, 2, 10, 11, 12, 50, 51, 13, 14, 15, 16] and ex["length"] == 11
    assert ex["loss_weights"] == [0, 0, 1, 1, 3, 0, 0, 0, 0, 1, 5]


def test_chunks_and_seeds_are_fixed() -> None:
    recs = [Record(str(i), f"q{i}", ["a"]) for i in range(5)]
    assert [[r.id for r in c] for c in question_chunks(recs, 2, 4)] == [["0", "1"], ["2", "3"], ["4"]]
    assert [len(c) for c in question_chunks(recs, 8, 4)] == [1] * 5  # N > batch: one question per chunk
    assert chunk_seed(0, 1) == chunk_seed(0, 1) and len({chunk_seed(s, c) for s in (0, 1) for c in (0, 1)}) == 4


# ----------------------------------------------------------------------------- sampling on the tiny world


@pytest.fixture(scope="module")
def world_records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")[:6]


@pytest.fixture(scope="module")
def records(world_records: list[Record]) -> list[Record]:
    """The six questions, the last two with a wrong gold answer: their replayed gold trajectories
    (which answer the true gold) fail the outcome filter."""
    return world_records[:4] + [replace(r, golden_answers=["not the answer"]) for r in world_records[4:]]


@pytest.fixture(scope="module")
def replay_engine(world_tokenizer: Any, tiny_retriever: BM25Retriever, world_records: list[Record]) -> RolloutEngine:
    """An engine over a scripted model that writes each question's gold trajectory."""
    golds = render_gold(world_records, tiny_retriever, k=3)
    cfg = RolloutConfig(batch_size=4, max_action_tokens=64)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever, cfg)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    model = ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    return RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)


def rft_config(**kw: Any) -> RFTConfig:
    train = SFTTrainingConfig(
        per_device_batch_size=2, learning_rate=3e-3, logging_steps=1, save_steps=2, max_steps=2, warmup_ratio=0.0, max_length=512
    )
    return RFTConfig(**({"samples_per_question": 2, "rollout": RolloutConfig(batch_size=4), "train": train} | kw))


def test_filters_keep_exactly_the_expected_pairs(tmp_path: Path, replay_engine: RolloutEngine, records: list[Record]) -> None:
    scorer = AlternatingScorer()
    counts = collect_rft_samples(rft_config(), tmp_path, replay_engine, records, scorer, progress=False)
    rows = list(read_jsonl(tmp_path / "samples.jsonl"))
    assert [r["id"] for r in rows] == [f"{r.id}#{k}" for r in records for k in range(2)]
    # Only the correct trajectories (the first four questions) reached the PRM.
    assert sorted(set(scorer.seen)) == sorted(r.id for r in records[:4]) and len(scorer.seen) == 8
    by_q = {r.id: r for r in records}
    for row in rows:
        traj = Trajectory.from_dict(row["trajectory"])
        assert row["correct"] == (row["question_id"] in {r.id for r in records[:4]})
        assert row["answer"] == traj.answer
        n = len(traj.actions)
        if row["correct"]:
            assert row["prm_logits"] == [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
            assert row["kept_actions"] == list(range(0, n, 2))  # searches and the answer
            assert [traj.actions[i].kind for i in row["kept_actions"]] == ["search"] * (n // 2) + ["answer"]
        else:
            assert row["prm_logits"] is None and row["kept_actions"] == []
            assert by_q[row["question_id"]].golden_answers == ["not the answer"]
    correct_actions = sum(len(r["trajectory"]["actions"]) for r in rows if r["correct"])
    assert counts.questions == 6 and counts.samples == 12 and counts.correct == 8
    assert counts.actions_scored == correct_actions
    assert counts.actions_kept == sum((len(r["trajectory"]["actions"]) + 1) // 2 for r in rows if r["correct"])
    assert counts.trajectories_kept == 8
    assert json.loads((tmp_path / "rft_counts.json").read_text())["actions_kept"] == counts.actions_kept
    assert [r["id"] for r in read_jsonl(tmp_path / "kept.jsonl")] == [r["id"] for r in rows if r["correct"]]

    # The examples train on the kept actions only: weight > 0 exactly on their model-written tokens.
    tok = replay_engine.tokenizer
    table = tag_weight_table(tag_token_ids(tok))
    examples, stats = build_rft_examples(list(read_jsonl(tmp_path / "kept.jsonl")), table)
    assert stats["kept"] == 8
    for ex, row in zip(examples, [r for r in rows if r["correct"]]):
        traj = Trajectory.from_dict(row["trajectory"])
        p = len(traj.prompt_ids)
        inside = {p + t for i in row["kept_actions"] for t in range(*traj.actions[i].span)}
        assert {i for i, w in enumerate(ex["loss_weights"]) if w > 0} == inside
        assert all(traj.env_mask[i - p] == 1 for i in inside)
        assert (
            ex["loss_weights"]
            == format_token_weights(torch.tensor([ex["input_ids"]]), torch.tensor([ex["loss_mask"]]), table)[0].tolist()
        )
        assert ex["input_ids"] == traj.prompt_ids + traj.completion_ids  # the sampled ids, never re-encoded

    # F1 filter: the wrong golds share no token with the answers, so nothing changes.
    f1_counts = collect_rft_samples(
        rft_config(correctness="f1", f1_threshold=0.5),
        tmp_path / "f1",
        replay_engine,
        records,
        AlternatingScorer(),
        progress=False,
    )
    assert f1_counts.correct == 8


def test_sampling_resumes_to_the_same_samples(tmp_path: Path, replay_engine: RolloutEngine, records: list[Record]) -> None:
    full = tmp_path / "full"
    collect_rft_samples(rft_config(), full, replay_engine, records, AlternatingScorer(), progress=False)
    # Interrupted: two questions done, then a crash in the middle of the next chunk (a cut line).
    part = tmp_path / "part"
    collect_rft_samples(rft_config(limit=2), part, replay_engine, records, AlternatingScorer(), progress=False)
    lines = (full / "samples.jsonl").read_text().splitlines(keepends=True)
    with (part / "samples.jsonl").open("a") as f:
        f.write(lines[4])
        f.write(lines[5][:50])
    scorer = AlternatingScorer()
    collect_rft_samples(rft_config(), part, replay_engine, records, scorer, progress=False)
    assert len(scorer.seen) == 4  # only the two unfinished chunks were sampled again (2 correct questions x 2)
    assert (part / "kept.jsonl").read_text() == (full / "kept.jsonl").read_text()
    assert (part / "rft_counts.json").read_text() == (full / "rft_counts.json").read_text()


def test_row_streams_sample_alike_in_any_batching(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, world_records: list[Record]
) -> None:
    """With ``sample_streams: row`` (the default) sample k of a question is the same trajectory
    whatever the rollout batch (and so the chunking) and whether rows resume early; with one
    generator per chunk (``batch``) the batch size changes which draws a row takes."""
    from tests.agent.test_rollout import _tiny_llama

    model = _tiny_llama(world_tokenizer)

    def samples(name: str, streams: str, batch_size: int, resume_early: bool) -> dict[str, list[int]]:
        cfg = rft_config(samples_per_question=2, sample_streams=streams)
        engine = RolloutEngine(
            model,
            world_tokenizer,
            tiny_retriever,
            RolloutConfig(batch_size=batch_size, max_action_tokens=24, max_actions=4, resume_early=resume_early),
        )
        collect_rft_samples(cfg, tmp_path / name, engine, world_records, AlternatingScorer(), progress=False)
        return {row["id"]: row["trajectory"]["completion_ids"] for row in read_jsonl(tmp_path / name / "samples.jsonl")}

    row = samples("row", "row", 4, True)
    assert len(row) == 12 and len({tuple(v) for v in row.values()}) > 6, "the samples differ from each other"
    assert samples("row-wide", "row", 12, False) == row
    assert samples("batch", "batch", 4, True) != samples("batch-wide", "batch", 12, True)


def test_a_run_sampled_before_row_streams_resumes_only_with_batch_streams(
    tmp_path: Path, replay_engine: RolloutEngine, records: list[Record]
) -> None:
    """``rft_config.json`` written before ``sample_streams`` existed was sampled with one generator
    per chunk: resuming it with row streams would mix two kinds of samples, so it is refused."""
    from prorag.stages.rft import _check_resumable

    collect_rft_samples(rft_config(limit=2), tmp_path, replay_engine, records, AlternatingScorer(), progress=False)
    stored = {k: v for k, v in dataclasses.asdict(rft_config()).items() if k != "sample_streams"}
    (tmp_path / "rft_config.json").write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="sample_streams"):
        _check_resumable(tmp_path, rft_config())
    _check_resumable(tmp_path, rft_config(sample_streams="batch"))
    with pytest.raises(ValueError, match="sample_streams must be one of"):
        rft_config(sample_streams="rows")


# ----------------------------------------------------------------------------- fine-tuning


def test_finetune_on_kept_pairs_moves_weights_and_resumes(
    tmp_path: Path, replay_engine: RolloutEngine, records: list[Record], world_tokenizer: Any
) -> None:
    collect_rft_samples(rft_config(), tmp_path, replay_engine, records, AlternatingScorer(), progress=False)
    kept = list(read_jsonl(tmp_path / "kept.jsonl"))
    model = make_tiny_model(world_tokenizer, "tiny", seed=0)
    policy = finetune_rft(rft_config(), tmp_path, model, world_tokenizer, kept)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss"])) and r["loss"] > 0 for r in rows)
    trained, _ = load_policy(str(policy))
    init = make_tiny_model(world_tokenizer, "tiny", seed=0).state_dict()
    changed = [k for k, v in trained.state_dict().items() if not torch.equal(init[k], v)]
    assert len(changed) >= len(init) // 2
    # Resume: ask for a third step in the same run folder.
    cfg3 = rft_config(train=replace(rft_config().train, max_steps=3))
    finetune_rft(cfg3, tmp_path, make_tiny_model(world_tokenizer, "tiny", seed=0), world_tokenizer, kept)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r] == [1, 2, 3]
    # Nothing kept: a clear error, not an empty training run ...
    with pytest.raises(ValueError, match="no kept"):
        finetune_rft(rft_config(), tmp_path / "none", model, world_tokenizer, [])
    # ... or, when asked, pi_sft written unchanged as pi_rft.
    fresh = make_tiny_model(world_tokenizer, "tiny", seed=0)
    copied = finetune_rft(rft_config(if_nothing_kept="copy_policy"), tmp_path / "copy", fresh, world_tokenizer, [])
    again, _ = load_policy(str(copied))
    assert all(torch.equal(v, init[k]) for k, v in again.state_dict().items())


def test_run_rft_end_to_end_and_refuses_changed_settings(
    tmp_path: Path, replay_engine: RolloutEngine, records: list[Record], world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> None:
    model = make_tiny_model(world_tokenizer, "tiny", seed=0)
    common = dict(
        model=model, tokenizer=world_tokenizer, records=records, retriever=tiny_retriever, sampler=replay_engine, progress=False
    )
    policy = run_rft(rft_config(), tmp_path, load_scorer=AlternatingScorer, prm_digest="aaaa", **common)
    assert (policy / "model.safetensors").exists()
    assert json.loads((tmp_path / "rft_config.json").read_text())["samples_per_question"] == 2
    with pytest.raises(ValueError, match="the PRM"):  # stored scores came from another PRM
        run_rft(rft_config(), tmp_path, scorer=AlternatingScorer(), prm_digest="bbbb", **common)
    run_rft(rft_config(), tmp_path, scorer=AlternatingScorer(), prm_digest="aaaa", **common)  # the same PRM resumes
    assert json.loads((tmp_path / "rft_counts.json").read_text())["correct"] == 8
    with pytest.raises(ValueError, match="prm_threshold"):
        run_rft(rft_config(prm_threshold=0.5), tmp_path, scorer=AlternatingScorer(), **common)
    with pytest.raises(ValueError, match="prm_scope"):
        run_rft(rft_config(prm_scope="reasoning"), tmp_path, scorer=AlternatingScorer(), **common)
    # A run made before a setting existed resumes when the setting is at its default.
    stored = json.loads((tmp_path / "rft_config.json").read_text())
    del stored["prm_scope"]
    (tmp_path / "rft_config.json").write_text(json.dumps(stored))
    run_rft(rft_config(), tmp_path, scorer=AlternatingScorer(), prm_digest="aaaa", **common)
    # A run of the earlier config layout (train: a whole flat SFTConfig) resumes: its sampling settings are the same.
    stored = json.loads((tmp_path / "rft_config.json").read_text())
    stored["train"] = {"model": "tiny", "k": 3, "lora": False, "lora_r": 16, "learning_rate": 3e-3}
    (tmp_path / "rft_config.json").write_text(json.dumps(stored))
    run_rft(rft_config(), tmp_path, scorer=AlternatingScorer(), prm_digest="aaaa", **common)
    with pytest.raises(ValueError, match="exactly one"):
        run_rft(rft_config(), tmp_path, **common)


# ----------------------------------------------------------------------------- the command


def test_rft_command_loads_everything_and_reports_counts(tmp_path: Path, tiny_world: Path, world_tokenizer: Any) -> None:
    """``prorag rft`` with a YAML config (nested ``rollout`` and ``train``), a saved policy and PRM
    and a BM25 index. A random tiny policy answers nothing right: the samples and counts are
    written, and the command ends with a one-line error instead of training on nothing."""
    import yaml
    from typer.testing import CliRunner

    from prorag.cli import app
    from prorag.models.checkpoints import save_policy
    from prorag.retrieval.index import build_index
    from prorag.supervision.reward_model import ProcessRewardModel, reward_model_from_policy

    policy, prm, index, run = tmp_path / "pi_sft", tmp_path / "prm", tmp_path / "index", tmp_path / "run"
    save_policy(make_tiny_model(world_tokenizer, "tiny"), world_tokenizer, policy)
    ProcessRewardModel(*reward_model_from_policy(policy)).save(prm)
    build_index(tiny_world / "corpus.jsonl", index, kind="bm25")
    fields = {
        "samples_per_question": 2,
        "rollout": {"batch_size": 4, "max_action_tokens": 8, "max_actions": 2, "max_completion_tokens": 64},
        "train": {"learning_rate": "3e-3", "max_steps": 1},
    }
    config = tmp_path / "rft.yaml"
    config.write_text(yaml.safe_dump(fields))
    args = ["rft", "--policy", str(policy), "--prm", str(prm), "--data", str(tiny_world / "train.jsonl")]
    args += ["--index", str(index), "--run-dir", str(run), "--config", str(config), "--limit", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "no kept (context, action) pair" in result.output
    counts = json.loads((run / "rft_counts.json").read_text())
    assert counts["questions"] == 3 and counts["samples"] == 6 and counts["correct"] == 0
    # the built-in world's records give their hop counts
    assert sum(c["samples"] for c in counts["by_hops"].values()) == 6
    resolved = json.loads((run / "rft_config.json").read_text())
    assert resolved["train"]["learning_rate"] == 3e-3 and resolved["rollout"]["max_actions"] == 2
