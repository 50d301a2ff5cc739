"""HiPRAG's step judgements (docs/METHOD.md §3) on a built-in-world chain with its gold
decomposition: over-search from re-asked answers (oracle), under-search from wrong non-search
conclusions, the ``hiprag`` outcome reward on hand-computed trajectories, and the batched re-ask
through the rollout engine with a tiny model."""

from __future__ import annotations

from typing import Any

import pytest

from prorag.agent.schema import Action, ActionKind, render_trajectory
from prorag.agent.trajectory import Trajectory
from prorag.data.records import Record
from prorag.method.rewards.hiprag import HiPRAGRewardConfig, SearchCounts
from prorag.method.rewards.outcome import OUTCOME_REWARDS, OutcomeRewardConfig, RewardInputs
from prorag.supervision import hiprag
from prorag.supervision.hiprag import reask, search_queries, trajectory_search_counts
from tests.supervision.test_judge import CHAIN  # director of Saenax -> Siril, born in -> Tamal, country -> Krirek

S, C, A = ActionKind.SEARCH, ActionKind.CONCLUDE, ActionKind.ANSWER


def chain_text(middle: str = "Tamal", final: str = "Krirek") -> str:
    """Search hop 1, conclude hop 2 from memory (``middle``), search hop 3, answer."""
    return render_trajectory(
        [
            Action(S, "t", "Saenax director", retrieval="Saenax was directed by Siril."),
            Action(C, "t", "Siril"),
            Action(C, "t", middle),
            Action(S, "t", "Tamal country", retrieval="Tamal is in Krirek."),
            Action(C, "t", "Krirek"),
            Action(A, "t", final),
        ]
    )


def test_without_reask_only_under_search_is_counted() -> None:
    assert trajectory_search_counts(CHAIN, chain_text()) == SearchCounts(search=2, over=0, non_search=1, under=0)
    assert trajectory_search_counts(CHAIN, chain_text(middle="Verol")) == SearchCounts(2, 0, 1, 1)


def test_over_search_is_a_correct_answer_without_documents() -> None:
    # Hop 1 known without documents (over-search); hop 3 answered wrongly (the search was needed).
    answers = {"Saenax director": "siril", "Tamal country": "Verol"}
    assert trajectory_search_counts(CHAIN, chain_text(), answers) == SearchCounts(2, 1, 1, 0)
    # No decomposition: the re-asked answer is compared with the step's own conclusion.
    bare = Record("q", CHAIN.question, ["Krirek"])
    assert trajectory_search_counts(bare, chain_text(), {"Saenax director": "Siril", "Tamal country": "Krirek"}) == SearchCounts(
        2, 2, 1, 0
    )
    assert trajectory_search_counts(bare, chain_text(middle="Verol"), {}).under == 0  # undecided without gold


class TextTokenizer:
    """Decodes a one-id completion to a stored text (the reward reads ids, here a text per id)."""

    eos_token_id = None

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.texts[ids[0]]


def traj(i: int) -> Trajectory:
    return Trajectory("w4-q1", CHAIN.question, [], [i], [1], [0.0], [], [], "answer")


@pytest.mark.parametrize(
    ("n_steps", "expected"),
    [
        # A = F = 1. Steps: search hop 1 (over), non-search Tamal (right), search hop 3 (optimal).
        ("all", [0.8 + 0.2 + 0.4 * 2 / 3, 0.8 + 0.2 + 0.4 * 1 / 3, 0.2]),
        ("search", [0.8 + 0.2 + 0.4 * 1 / 2, 0.8 + 0.2 + 0.4 * 1 / 2, 0.2]),
    ],
)
def test_hiprag_reward_hand_computed(monkeypatch: pytest.MonkeyPatch, n_steps: str, expected: list[float]) -> None:
    asked: list[list[str]] = []

    def fake_reask(policy: Any, tokenizer: Any, queries: list[str], config: Any = None) -> dict[str, str | None]:
        asked.append(list(queries))
        return {"Saenax director": "Siril", "Tamal country": None}

    monkeypatch.setattr(hiprag, "reask", fake_reask)
    cfg = OutcomeRewardConfig(form="hiprag", hiprag=HiPRAGRewardConfig(n_steps=n_steps))  # type: ignore[arg-type]
    reward = OUTCOME_REWARDS.get("hiprag")(cfg)
    tok = TextTokenizer([chain_text(), chain_text(middle="Verol"), chain_text(final="Verol")])
    trajs = [traj(0), traj(1), traj(2)]
    out = reward(RewardInputs(trajs, [["Krirek"]] * 3, tok, [CHAIN] * 3, policy=object()))
    assert out == pytest.approx(expected)
    assert len(asked) == 1 and len(asked[0]) == 6  # one batched re-ask for the whole batch
    # No policy: no re-ask, so no step is over-search.
    assert reward(RewardInputs(trajs[:1], [["Krirek"]], tok, [CHAIN]))[0] == pytest.approx(1.4) and len(asked) == 1


def test_reask_runs_one_action_without_documents(world_tokenizer: Any) -> None:
    from prorag.models.tiny import make_tiny_model

    model = make_tiny_model(world_tokenizer, seed=0)
    queries = ["Saenax director", "Tamal country", "Saenax director", ""]
    answers = reask(model, world_tokenizer, queries)
    assert list(answers) == ["Saenax director", "Tamal country"]  # distinct, non-empty, in order
    assert all(a is None or isinstance(a, str) for a in answers.values())
    assert search_queries(chain_text()) == ["Saenax director", "Tamal country"]
