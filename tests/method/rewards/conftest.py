"""Hand-built trajectories for the reward tests: token ids, env mask and token-level actions
exactly as the rollout engine records them, with a ``text`` that has its tags stripped (what
TRL hands a reward function) so that a reward reading the text instead of the ids fails."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from prorag.agent.gold import tokenize_segments
from prorag.agent.schema import parse_token_actions, render_env_turn
from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.models.tags import tag_token_ids

#: A well-formed trajectory: search, retrieval, conclusion, answer; (text, written by the model).
SEARCH = ("<step> I need the capital </step><subquery> capital of France </subquery>", True)
RETRIEVAL = (render_env_turn("Doc 1(Title: France) Paris is the capital of France."), False)
CONCLUDE = (" the capital is Paris </step><subanswer> Paris </subanswer>", True)
OPENER = (render_env_turn(), False)


def answer(text: str) -> tuple[str, bool]:
    """The model's last action after an environment-written opener."""
    return (f" so the answer follows </step><answer> {text} </answer>", True)


def valid_segments(final: str = "Paris") -> list[tuple[str, bool]]:
    return [SEARCH, RETRIEVAL, CONCLUDE, OPENER, answer(final)]


MakeTraj = Callable[..., Trajectory]


@pytest.fixture(scope="session")
def segments() -> Any:
    """The segment builders above, for the tests (``segments.valid("Paris")``, ``segments.answer(...)``)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        valid=valid_segments, answer=answer, search=SEARCH, retrieval=RETRIEVAL, conclude=CONCLUDE, opener=OPENER
    )


@pytest.fixture(scope="module")
def make_traj(world_tokenizer: Any) -> MakeTraj:
    tags = tag_token_ids(world_tokenizer)

    def build(segments: Sequence[tuple[str, bool]], stop_reason: str = "answer", extra_ids: Sequence[int] = ()) -> Trajectory:
        ids, mask = tokenize_segments(world_tokenizer, segments)
        ids, mask = ids + list(extra_ids), mask + [1] * len(extra_ids)
        actions = [
            ActionRecord(a.kind.value if a.kind is not None else None, a.span, a.well_formed)
            for a in parse_token_actions(ids, tags, mask)
        ]
        return Trajectory(
            id="q1",
            question="What is the capital of France?",
            prompt_ids=world_tokenizer("Question: What is the capital of France?\n", add_special_tokens=False)["input_ids"],
            completion_ids=ids,
            env_mask=mask,
            logprobs=[0.0] * len(ids),
            actions=actions,
            retrievals=[],
            stop_reason=stop_reason,
            text=world_tokenizer.decode(ids, skip_special_tokens=True),  # tags stripped: never to be read
            answer=None,
            valid=False,
        )

    return build
