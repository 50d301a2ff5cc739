"""The step reward (Eq. 5) in the paper's and the reference code's forms, on hand-computed
values; I_step comes from the token-level actions, never from the stripped text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.method.rewards.process import (
    StepRewardConfig,
    prm_judged_actions,
    score_step_rewards,
    step_reward,
    step_rewards,
    trajectory_step_rewards,
)
from prorag.supervision.reward_model import StepScorer

PAPER = StepRewardConfig()
REFERENCE = StepRewardConfig(form="reference")


def test_pure_formula_in_both_forms() -> None:
    # paper: logit + nu1 * I_step
    assert step_rewards([2.0, -1.0, 0.0], [True, False, True], StepRewardConfig(nu1=0.5)) == pytest.approx([2.5, -1.0, 0.5])
    assert step_rewards([2.0, -1.0], [True, False], PAPER) == pytest.approx([3.0, -1.0])
    # reference: sigmoid(logit) + (1 if I_step else -2)
    sig2, sig_1 = 1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(1.0))
    assert sig2 == pytest.approx(0.880797, abs=1e-6)
    assert step_rewards([2.0, -1.0, 0.0], [True, False, True], REFERENCE) == pytest.approx([1 + sig2, sig_1 - 2, 1.5])
    # nu1 belongs to the paper's form only; huge logits neither overflow nor break the order
    assert step_reward(0.0, True, StepRewardConfig(form="reference", nu1=9.0)) == pytest.approx(1.5)
    assert step_reward(-1000.0, False, REFERENCE) == pytest.approx(-2.0)
    assert step_reward(1000.0, False, REFERENCE) < step_reward(-1000.0, True, REFERENCE)
    # bounded: sigmoid(logit) + nu1 * I_step, in (0, 1 + nu1) however confident the PRM
    bounded = StepRewardConfig(form="bounded", nu1=0.5)
    assert step_rewards([2.0, -1.0, 0.0], [True, False, True], bounded) == pytest.approx([0.5 + sig2, sig_1, 1.0])
    assert 0.0 <= step_reward(-1000.0, False, bounded) < step_reward(1000.0, True, bounded) <= 1.5
    with pytest.raises(ValueError, match="logits"):
        step_rewards([1.0], [True, False])
    with pytest.raises(ValueError, match="finite"):
        step_reward(float("inf"), True, PAPER)
    # NaN is a source's "no step reward here" and stays NaN in every form
    assert all(math.isnan(step_reward(float("nan"), True, c)) for c in (PAPER, REFERENCE, bounded))
    with pytest.raises(ValueError, match="form"):
        StepRewardConfig(form="sigmoid")  # type: ignore[arg-type]


def test_prm_scope_leaves_only_a_well_formed_answer_to_the_outcome() -> None:
    acts = [
        ActionRecord("search", (0, 3), True),
        ActionRecord("conclude", (3, 5), True),
        ActionRecord("answer", (5, 7), True),
        ActionRecord("answer", (7, 8), False),  # a malformed answer keeps its (format-penalised) verdict
        ActionRecord(None, (8, 9), False),
    ]
    assert prm_judged_actions(acts) == [0, 1, 2, 3, 4]
    assert prm_judged_actions(acts, "all") == [0, 1, 2, 3, 4]
    assert prm_judged_actions(acts, "reasoning") == [0, 1, 3, 4]
    assert prm_judged_actions([], "reasoning") == []
    with pytest.raises(ValueError, match="prm_scope"):
        prm_judged_actions(acts, "steps")  # type: ignore[arg-type]


def test_step_rewards_of_trajectories_follow_their_token_actions(make_traj: Any, segments: Any) -> None:
    good = make_traj(segments.valid("Paris"))
    assert [a.well_formed for a in good.actions] == [True, True, True]
    # A malformed middle action (no </step>) and a last action cut mid-thought (kind None).
    bad = make_traj(
        [
            segments.search,
            segments.retrieval,
            (" the capital is Paris <subanswer> Paris </subanswer>", True),
            segments.opener,
            (" and so", True),
        ],
        stop_reason="max_action_tokens",
    )
    assert [a.well_formed for a in bad.actions] == [True, False, False]
    assert bad.actions[2].kind is None
    empty = make_traj([], stop_reason="eos")
    logits = [[0.5, -0.5, 1.0], [0.5, 0.3, -0.2], []]
    got = trajectory_step_rewards([good, bad, empty], logits, PAPER)
    assert got == [pytest.approx([1.5, 0.5, 2.0]), pytest.approx([1.5, 0.3, -0.2]), []]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    got = trajectory_step_rewards([bad], [logits[1]], REFERENCE)
    assert got == [pytest.approx([sig(0.5) + 1, sig(0.3) - 2, sig(-0.2) - 2])]
    with pytest.raises(ValueError, match="q1"):
        trajectory_step_rewards([good], [[0.1, 0.2]])
    with pytest.raises(ValueError, match="trajectories"):
        trajectory_step_rewards([good, bad], [[0.1, 0.2, 0.3]])


def test_i_step_is_not_read_from_the_stripped_text(make_traj: Any, segments: Any) -> None:
    bad = make_traj([("<step> the answer <answer> Paris </answer>", True)])
    bad.text = make_traj(segments.valid("Paris")).text  # looks fine as text, but the ids say malformed
    assert trajectory_step_rewards([bad], [[0.0]], PAPER) == [[0.0]]


class FakeScorer:
    """Scores action ``i`` of every trajectory ``0.1 * i - 0.1`` and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        self.seen.extend(t.id for t in trajectories)
        return [[0.1 * i - 0.1 for i in range(len(t.actions))] for t in trajectories]


def test_score_step_rewards_through_any_step_scorer(make_traj: Any, segments: Any) -> None:
    scorer = FakeScorer()
    assert isinstance(scorer, StepScorer)
    good = make_traj(segments.valid("Paris"))
    assert score_step_rewards(scorer, [good]) == [pytest.approx([0.9, 1.0, 1.1])]
    assert scorer.seen == ["q1"]
