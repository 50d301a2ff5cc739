"""HiPRAG's pure part (docs/METHOD.md §3): the cut into search / non-search steps, the
hierarchical reward on hand-computed values, the step counts, and the outcome-reward registry."""

from __future__ import annotations

import pytest

from prorag.agent.schema import Action, ActionKind, parse_trajectory, render_trajectory
from prorag.core.config import apply_overrides
from prorag.core.errors import DataError
from prorag.method.rewards.hiprag import (
    HiPRAGRewardConfig,
    ReasoningStep,
    SearchCounts,
    hiprag_value,
    reasoning_steps,
    search_counts,
)
from prorag.method.rewards.outcome import OUTCOME_REWARDS, OutcomeRewardConfig, outcome_value
from prorag.supervision import hiprag  # noqa: F401  (registers "hiprag" with its settings)

S, C, A = ActionKind.SEARCH, ActionKind.CONCLUDE, ActionKind.ANSWER


def test_steps_are_search_plus_conclusion_or_a_bare_conclusion() -> None:
    text = render_trajectory(
        [
            Action(S, "t", "Saenax director", retrieval="Doc 1(Title: Saenax) directed by Siril"),
            Action(C, "t", "Siril"),
            Action(C, "t", "Tamal"),  # no search before it: a non-search step
            Action(S, "t", "Tamal country", retrieval="Doc 1(Title: Tamal) in Krirek"),
            Action(S, "t", "Krirek capital", retrieval=""),  # a search with no conclusion after it
            Action(A, "t", "Krirek"),  # the answer is not a step
        ]
    )
    assert reasoning_steps(parse_trajectory(text).actions) == [
        ReasoningStep(True, "Saenax director", "Siril"),
        ReasoningStep(False, "", "Tamal"),
        ReasoningStep(True, "Tamal country", ""),
        ReasoningStep(True, "Krirek capital", ""),
    ]


@pytest.mark.parametrize(
    ("correct", "valid", "search", "optimal", "n_steps", "expected"),
    [
        # A = F = 1; steps: search optimal, search over-search, non-search optimal.
        (True, True, [True, True, False], [True, False, True], "all", 0.8 + 0.2 + 0.4 * 2 / 3),
        (True, True, [True, True, False], [True, False, True], "search", 0.8 + 0.2 + 0.4 * 1 / 2),
        (True, False, [True], [True], "all", 0.8),  # bad format: no F, no bonus
        (False, True, [True], [True], "all", 0.2),  # wrong answer: format only
        (False, False, [True], [True], "all", 0.0),
        (True, True, [], [], "all", 1.0),  # no step: no bonus
        (True, True, [False], [True], "search", 1.0),  # N = search steps = 0
    ],
)
def test_hierarchical_reward_hand_computed(
    correct: bool, valid: bool, search: list[bool], optimal: list[bool], n_steps: str, expected: float
) -> None:
    cfg = HiPRAGRewardConfig(n_steps=n_steps)  # type: ignore[arg-type]
    assert hiprag_value(correct, valid, search, optimal, cfg) == pytest.approx(expected)


def test_lambdas_and_checks() -> None:
    cfg = HiPRAGRewardConfig(lambda_f=0.5, lambda_p=1.0)
    assert hiprag_value(True, True, [True, False], [True, True], cfg) == pytest.approx(0.5 + 0.5 + 1.0)
    with pytest.raises(ValueError, match="n_steps must be one of"):
        HiPRAGRewardConfig(n_steps="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 search flags but 1"):
        hiprag_value(True, True, [True, False], [True], cfg)


def test_search_counts_and_rates() -> None:
    counts = search_counts([True, True, False, False, False], [True, False, True, False, False], [True, False, True, True, False])
    assert counts == SearchCounts(search=2, over=1, non_search=3, under=2)  # flags off their kind are ignored
    assert counts.over_search_rate == 0.5 and counts.under_search_rate == pytest.approx(2 / 3)
    total = counts + SearchCounts(search=2, over=0)
    assert total.over_search_rate == 0.25
    assert SearchCounts().over_search_rate is None and SearchCounts().under_search_rate is None


def test_outcome_rewards_by_name() -> None:
    assert OUTCOME_REWARDS.names()[:4] == ["paper", "reference", "f1_if_valid", "hiprag"]
    cfg = apply_overrides(OutcomeRewardConfig(), ["form=hiprag", "hiprag.n_steps=search", "hiprag.lambda_p=0.5"])
    assert cfg.form == "hiprag" and cfg.hiprag == HiPRAGRewardConfig(n_steps="search", lambda_p=0.5)
    with pytest.raises(DataError, match="unknown outcome reward 'hipraq'.*did you mean 'hiprag'"):
        apply_overrides(OutcomeRewardConfig(), ["form=hipraq"])
    with pytest.raises(ValueError, match="is not Eq. 6"):
        outcome_value(1.0, True, cfg)
