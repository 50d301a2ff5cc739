"""CP-Search's chain progressive reward (docs/METHOD.md §5) on hand-computed trajectories: the
accumulators, Delta_t from gold evidence per hop (a resolved hop is no progress), the segment
broadcast over actions, and the ``"cpsearch"`` source by name."""

from __future__ import annotations

import math

import pytest

from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.data.records import Record
from prorag.method.rewards.cpsearch import (
    CPSearchConfig,
    CPSearchSteps,
    cpsearch_action_rewards,
    hop_evidence,
    progressive_rewards,
    retrieval_validity,
    segment_rewards,
)
from prorag.method.rewards.outcome import OutcomeRewardConfig, outcome_value
from prorag.method.rewards.sources import STEP_REWARD_SOURCES


def test_accumulators_by_hand() -> None:
    # valid: g+ 1 -> 1.2 -> 1.4; invalid: g- -1 -> -1.3 -> -1.6; pr read after the update
    assert progressive_rewards([1, 1, 0, 0, 1]) == pytest.approx([1.2, 1.4, -1.3, -1.6, 1.6])
    assert progressive_rewards([0, 1]) == pytest.approx([-1.3, 1.2])
    assert progressive_rewards([]) == []
    cfg = CPSearchConfig(alpha=0.5, beta=-1.0, gamma_plus=2.0, gamma_minus=-3.0)
    assert progressive_rewards([0, 1, 1, 0], cfg) == pytest.approx([-4.0, 2.5, 3.0, -5.0])


def test_validity_needs_evidence_of_an_unresolved_hop() -> None:
    hops = [{"d1"}, {"d2", "d3"}]
    assert retrieval_validity([["x"], ["d1", "y"], ["d1"], ["d3"], ["d2"]], hops) == [0, 1, 0, 1, 0]
    # one retrieval holding both hops' evidence resolves both: the next one finds nothing new
    assert retrieval_validity([["d1", "d2"], ["d3"]], hops) == [1, 0]


def _record(**metadata: object) -> Record:
    return Record("q", "Who?", ["Paris"], dict(metadata))


def test_hop_evidence_from_decomposition_or_gold_doc_ids() -> None:
    rec = _record(decomposition=[{"doc_ids": ["a"]}, {"doc_ids": ["b", "c"]}], gold_doc_ids=["z"])
    assert hop_evidence(rec) == [{"a"}, {"b", "c"}]
    assert hop_evidence(_record(gold_doc_ids=["p1", "p2", "p1"])) == [{"p1"}, {"p2"}]  # HotpotQA: one per paragraph
    assert hop_evidence(_record(decomposition=[{"doc_ids": []}], gold_doc_ids=["p1"])) == [{"p1"}]  # MuSiQue-like without ids
    with pytest.raises(ValueError, match=r"record 'q' has no gold evidence"):
        hop_evidence(_record())


def test_segments_end_at_their_retrieval() -> None:
    # actions: search0, conclude1, search2, conclude3, answer4; retrievals after actions 0 and 2
    assert segment_rewards(5, [0, 2], [1.2, -1.3]) == [1.2, -1.3, -1.3, -1.3, -1.3]
    assert segment_rewards(3, [1], [-1.3]) == [-1.3, -1.3, -1.3]
    assert all(math.isnan(x) for x in segment_rewards(2, [], []))
    with pytest.raises(ValueError):
        segment_rewards(2, [0], [])


def _traj(kinds: list[str], retrievals: list[tuple[int, list[str]]]) -> Trajectory:
    actions = [ActionRecord(k, (2 * i, 2 * i + 2), True) for i, k in enumerate(kinds)]
    return Trajectory(
        id="q",
        question="Who?",
        prompt_ids=[],
        completion_ids=[0] * (2 * len(kinds)),
        env_mask=[1] * (2 * len(kinds)),
        logprobs=[0.0] * (2 * len(kinds)),
        actions=actions,
        retrievals=[{"query": "x", "doc_ids": d, "action": a} for a, d in retrievals],
        stop_reason="answer",
    )


def test_source_by_name_on_a_hand_built_trajectory() -> None:
    rec = _record(decomposition=[{"doc_ids": ["a"]}, {"doc_ids": ["b"]}])
    # search a (valid, 1.2), conclude, search a again (resolved: invalid, -1.3), conclude,
    # search b (valid, 1.4), conclude, answer (after the last retrieval: its pr, 1.4)
    traj = _traj(
        ["search", "conclude", "search", "conclude", "search", "conclude", "answer"],
        [(0, ["a", "x"]), (2, ["a"]), (4, ["b"])],
    )
    expected = [1.2, -1.3, -1.3, 1.4, 1.4, 1.4, 1.4]
    assert cpsearch_action_rewards(traj, rec) == pytest.approx(expected)
    source = STEP_REWARD_SOURCES.get("cpsearch")(None)
    assert isinstance(source, CPSearchSteps) and source.final
    assert source([traj], [rec]) == [pytest.approx(expected)]
    no_search = source([_traj(["answer"], [])], [rec])[0]
    assert len(no_search) == 1 and math.isnan(no_search[0])
    with pytest.raises(ValueError, match="needs the record"):
        source([traj])


def test_cpsearch_outcome_is_f1_gated_by_format() -> None:
    cfg = OutcomeRewardConfig(form="f1_if_valid")
    assert outcome_value(0.4, True, cfg) == 0.4 and outcome_value(1.0, False, cfg) == 0.0
    assert not cfg.strict
