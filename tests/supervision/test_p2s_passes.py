"""P2S's model-dependent part (docs/METHOD.md §4) with a tiny model on a built-in-world question:
the batched likelihood passes equal unpadded single forwards, the synthesis keeps the candidate
that makes the gold answer most likely, the whole path reward equals Eq. 6-8 recomputed one
forward at a time (tag steps and chunks), and Eq. 9 / the warm-up skip every pass they can."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.gold import tokenize_segments
from prorag.agent.prompts import prompt_token_ids
from prorag.agent.schema import parse_token_actions, render_env_turn
from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.data.records import Record, read_records
from prorag.method.rewards.outcome import OUTCOME_REWARDS, OutcomeRewardConfig, RewardInputs
from prorag.method.rewards.p2s import P2SConfig, chunk_ends, path_faithfulness, tag_ends
from prorag.models.tags import tag_token_ids
from prorag.models.tiny import make_tiny_model
from prorag.supervision import p2s
from prorag.supervision.p2s import answer_target, reasoning_path, sequence_logprobs

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def record(tiny_world: Path) -> Record:
    rec = read_records(tiny_world / "train.jsonl")[0]
    assert rec.golden_answers == ["Fedek"]
    return rec


@pytest.fixture(scope="module")
def model(world_tokenizer: Any) -> Any:
    return make_tiny_model(world_tokenizer, seed=0)


def build(tok: Any, rec: Record, director: str, answer: str, *, cut: bool = False) -> Trajectory:
    """Search, retrieval, conclusion ``director``, answer ``answer`` (``cut``: stopped before answering)."""
    segments = [
        ("<step> I need to know: Who directed Raezax? </step><subquery> Raezax director </subquery>", True),
        (render_env_turn("Doc 1(Title: Raezax) Raezax was directed by Kothir."), False),
        (f" Raezax was directed by {director}. </step><subanswer> {director} </subanswer>", True),
        (render_env_turn(), False),
        (f" So the answer is {answer}. </step><answer> {answer} </answer>", True),
    ]
    ids, mask = tokenize_segments(tok, segments[:3] if cut else segments)
    actions = [
        ActionRecord(a.kind.value if a.kind is not None else None, a.span, a.well_formed)
        for a in parse_token_actions(ids, tag_token_ids(tok), mask)
    ]
    stop = "max_actions" if cut else "answer"
    return Trajectory(rec.id, rec.question, prompt_token_ids(tok, rec.question), ids, mask, [0.0] * len(ids), actions, [], stop)


def single_logprob(model: Any, context: list[int], target: list[int], weights: list[int]) -> float:
    """Reference: one unpadded forward, the weighted sum of the target's token log-probabilities."""
    ids = torch.tensor([context + target])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return float(sum(w * x for w, x in zip(weights, logp[len(context) - 1 :].tolist(), strict=True)))


def test_batched_passes_equal_single_forwards(model: Any, world_tokenizer: Any) -> None:
    passes = [([5, 6, 7], [8, 9], [1, 1]), ([5], [9, 9, 9, 10], [1, 0, 1, 1]), ([5, 6, 7], [8, 9], [1, 1]), ([11, 12], [13], [1])]
    got = sequence_logprobs(model, passes, pad_id=0, batch_size=2)
    want = [single_logprob(model, *p) for p in passes]
    assert got == pytest.approx(want, abs=1e-4)
    assert got[0] == got[2] and want[1] != pytest.approx(single_logprob(model, [5], [9, 9, 9, 10], [1, 1, 1, 1]))


def s_k(model: Any, tok: Any, rec: Record, cand: Trajectory) -> float:
    """Eq. 5 one forward at a time: log pi(<answer> y* </answer> | q, z_k)."""
    z = cand.completion_ids[: reasoning_path(cand, tok.convert_tokens_to_ids("<answer>"))]
    target = answer_target(tok, "Fedek")
    return single_logprob(model, prompt_token_ids(tok, rec.question) + z, target, [1] * len(target))


def expected_path_reward(model: Any, tok: Any, rec: Record, traj: Trajectory, gold: Trajectory, config: P2SConfig) -> float:
    """Eq. 6-8 one forward at a time."""
    q = prompt_token_ids(tok, rec.question)
    pad = tok.pad_token_id
    n = reasoning_path(traj, tok.convert_tokens_to_ids("<answer>"))
    if config.steps == "tags":
        ends = tag_ends([a.span[0] for a in traj.actions], n)
        gold_ends = tag_ends([a.span[0] for a in gold.actions], len(gold.completion_ids))
    else:
        ends = chunk_ends(n, config.max_steps)
        gold_ends = chunk_ends(len(gold.completion_ids), config.max_steps)
    starts = [0, *gold_ends[:-1]]
    suffixes = [(gold.completion_ids[s:], gold.env_mask[s:]) for s in starts]
    steps = []
    for e in ends[:-1]:
        gains = [
            single_logprob(model, q + traj.completion_ids[:e], s, w) - single_logprob(model, q + [pad] * e, s, w)
            for s, w in suffixes
        ]
        steps.append(max(gains))
    target = answer_target(tok, "Fedek")
    last = single_logprob(model, q + traj.completion_ids[:n], target, [1] * len(target))
    return path_faithfulness([*steps, last])


@pytest.mark.parametrize("steps", ["tags", "chunks"])
def test_synthesis_keeps_the_most_likely_gold_path_and_the_reward_is_eq_6_to_8(
    monkeypatch: pytest.MonkeyPatch, model: Any, world_tokenizer: Any, record: Record, steps: str
) -> None:
    tok = world_tokenizer
    valid = [build(tok, record, d, a) for d, a in (("Kothir", "Fedek"), ("Konden", "Fedek"), ("Kothir", "Shuruth"))]
    scores = [s_k(model, tok, record, c) for c in valid]
    assert len(set(scores)) == 3
    # Order the candidates worst, best, middle (a malformed one first): picking the first, the
    # last, the worst or a malformed candidate all fail.
    order = sorted(range(3), key=lambda i: scores[i])
    best = valid[order[2]]
    candidates = [build(tok, record, "Dadal", "Fedek", cut=True), valid[order[0]], best, valid[order[1]]]
    asked: list[tuple[list[Record], int]] = []

    def fake_synthesize(
        policy: Any, tokenizer: Any, records: list[Record], config: P2SConfig, retriever: Any, seed: int, step: int
    ) -> Any:
        asked.append((records, config.k))
        return [candidates for _ in records]

    monkeypatch.setattr(p2s, "synthesize", fake_synthesize)
    cfg = OutcomeRewardConfig(form="p2s", p2s=P2SConfig(k=4, steps=steps, max_steps=3))  # type: ignore[arg-type]
    reward = OUTCOME_REWARDS.get("p2s")(cfg)
    group = [
        build(tok, record, "Kothir", "Shuruth"),
        build(tok, record, "Dadal", "Viandul"),
        build(tok, record, "x", "y", cut=True),
    ]
    out = reward(RewardInputs(group, [["Fedek"]] * 3, tok, None, policy=model))
    assert len(asked) == 1 and [r.id for r in asked[0][0]] == [record.id] and asked[0][0][0].golden_answers == ["Fedek"]
    assert reward.gold_paths[record.id] is best
    want = [expected_path_reward(model, tok, record, t, best, cfg.p2s) for t in group[:2]]
    assert out[:2] == pytest.approx(want, abs=1e-3) and out[2] == -1.0
    assert out[0] != pytest.approx(out[1])


class Policy:
    """A stand-in policy: any likelihood pass through it is an error."""

    def parameters(self) -> Any:
        raise AssertionError("no likelihood pass expected")


def test_solved_group_malformed_and_warmup_need_no_pass(
    monkeypatch: pytest.MonkeyPatch, world_tokenizer: Any, record: Record
) -> None:
    tok = world_tokenizer
    monkeypatch.setattr(p2s, "synthesize", lambda *a, **k: pytest.fail("no synthesis expected"))
    cfg = OutcomeRewardConfig(form="p2s", p2s=P2SConfig(warmup_steps=2))
    reward = OUTCOME_REWARDS.get("p2s")(cfg)
    group = [
        build(tok, record, "Kothir", "Fedek"),
        build(tok, record, "Kothir", "Shuruth"),
        build(tok, record, "x", "y", cut=True),
    ]
    policy = Policy()
    golds = [["Fedek"]] * 3
    # Warm-up (2 batches): format only.
    assert reward(RewardInputs(group[1:], golds[1:], tok, None, policy)) == [1.0, -1.0]
    assert reward(RewardInputs(group[1:], golds[1:], tok, None, policy)) == [1.0, -1.0]
    # Then a solved group: the outcome (1 right, 0 wrong), -1 malformed, no pass.
    assert reward(RewardInputs(group, golds, tok, None, policy)) == [1.0, 0.0, -1.0]
    # Without a policy (TRL's logged reward): the path term is 0, nothing counted.
    assert reward(RewardInputs(group[1:], golds[1:], tok)) == [0.0, -1.0]


def test_synthesis_samples_k_paths_per_question_given_the_gold_answer(model: Any, world_tokenizer: Any, record: Record) -> None:
    from prorag.agent.rollout_config import RolloutConfig

    config = P2SConfig(k=3, synthesis=RolloutConfig(max_actions=2, max_action_tokens=8, max_completion_tokens=32))
    out = p2s.synthesize(model, world_tokenizer, [record, record], config, seed=1)
    assert [len(c) for c in out] == [3, 3]
    hinted = prompt_token_ids(world_tokenizer, f"{record.question}\nThe answer is: Fedek")
    assert all(t.prompt_ids == hinted for c in out for t in c)
    assert len({tuple(t.completion_ids) for t in out[0]}) > 1  # sampled, not greedy


def test_row_streams_give_a_question_the_same_candidates_beside_any_other(
    model: Any, world_tokenizer: Any, record: Record, tiny_world: Path
) -> None:
    """With ``sample_streams: row`` a question's K candidates depend on (synthesis seed, RL seed,
    step, question id, candidate), not on which other questions need a path reward in the same
    call; another step or RL seed draws others. The streams are :func:`stream_seed` digests."""
    from prorag.agent.rollout_config import RolloutConfig
    from prorag.agent.sampling import stream_seed

    other = next(r for r in read_records(tiny_world / "train.jsonl") if r.id != record.id)
    config = P2SConfig(k=3, synthesis=RolloutConfig(max_actions=2, max_action_tokens=8, max_completion_tokens=32))
    assert config.sample_streams == "row"
    assert p2s.hint_seed(config, 5, 2, record.id, 1) == stream_seed("prorag-p2s", 0, 5, 2, record.id, 1)

    def paths(records: list[Record], cfg: P2SConfig = config, seed: int = 5, step: int = 2) -> list[tuple[int, ...]]:
        out = p2s.synthesize(model, world_tokenizer, records, cfg, seed=seed, step=step)
        return [tuple(t.completion_ids) for t in out[[r.id for r in records].index(record.id)]]

    alone = paths([record])
    assert len(set(alone)) > 1
    assert paths([other, record]) == alone
    assert paths([record], step=3) != alone and paths([record], seed=6) != alone
    # One generator per call: the candidates follow the question's place in the batch.
    batch = P2SConfig(k=3, synthesis=config.synthesis, sample_streams="batch")
    assert paths([record], batch) == paths([record], batch, seed=6)  # the RL seed is not part of it
    assert paths([other, record], batch) != paths([record], batch)


def test_the_reward_names_its_streams_by_the_trainers_step(
    monkeypatch: pytest.MonkeyPatch, model: Any, world_tokenizer: Any, record: Record
) -> None:
    """The trainer's seed and step reach :func:`p2s.synthesize` with row streams; without a step
    (outside a trainer), or with batch streams, the reward's own count of calls stands in."""
    asked: list[tuple[int, int]] = []

    def fake_synthesize(
        policy: Any, tokenizer: Any, records: list[Record], config: P2SConfig, retriever: Any, seed: int, step: int
    ) -> Any:
        asked.append((seed, step))
        return [[] for _ in records]

    monkeypatch.setattr(p2s, "synthesize", fake_synthesize)
    group = [build(world_tokenizer, record, "Kothir", "Shuruth"), build(world_tokenizer, record, "Dadal", "Viandul")]
    golds = [["Fedek"]] * 2
    for streams in ("row", "batch"):
        reward = OUTCOME_REWARDS.get("p2s")(OutcomeRewardConfig(form="p2s", p2s=P2SConfig(sample_streams=streams)))
        policy = make_tiny_model(world_tokenizer, seed=1)  # a fresh policy: the count of calls starts at 0
        reward(RewardInputs(group, golds, world_tokenizer, None, policy, seed=7, step=12))
        reward(RewardInputs(group, golds, world_tokenizer, None, policy, seed=7))
    assert asked == [(7, 12), (7, 1), (7, 0), (7, 1)]
