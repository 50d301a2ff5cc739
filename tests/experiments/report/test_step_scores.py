"""PRM step scores of evaluation trajectories: one logit per action, batches, refusal of a short scorer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from prorag.agent.schema import Action, ActionKind
from prorag.agent.trajectory import Trajectory
from prorag.data.jsonl import read_jsonl, write_jsonl
from prorag.data.records import read_records
from prorag.experiments.report.step_scores import score_eval_trajectories
from tests.experiments.report.hand_run import KindScorer, hand_trajectory


def test_score_eval_trajectories_writes_one_logit_per_action(tmp_path: Path, tiny_world: Path) -> None:
    records = read_records(tiny_world / "test.jsonl")[:3]
    trajs = [
        hand_trajectory(
            records[0].id,
            "q0",
            [Action(ActionKind.SEARCH, "t", "q", retrieval="Doc 1(Title: A) a"), Action(ActionKind.ANSWER, "t", "x")],
        ),
        hand_trajectory(records[1].id, "q1", [Action(ActionKind.ANSWER, "t", "y")]),
        hand_trajectory(records[2].id, "q2", [Action(ActionKind.CONCLUDE, "t", "c"), Action(ActionKind.ANSWER, "t", "z")]),
    ]
    write_jsonl(tmp_path / "trajectories.jsonl", [t.to_dict() for t in trajs])
    scorer = KindScorer()
    out = score_eval_trajectories(scorer, tmp_path, batch_size=2)
    assert out == tmp_path / "step_scores.jsonl"
    rows = list(read_jsonl(out))
    assert [r["id"] for r in rows] == [t.id for t in trajs]
    assert [r["logits"] for r in rows] == [[2.0, -0.75], [-1.0], [0.5, -0.75]]  # kind logit + 0.25 * position
    assert scorer.calls == [2, 1], "batches of batch_size trajectories"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left"


def test_score_eval_trajectories_refuses_a_scorer_that_drops_actions(tmp_path: Path) -> None:
    traj = hand_trajectory("q", "q", [Action(ActionKind.CONCLUDE, "t", "c"), Action(ActionKind.ANSWER, "t", "a")])
    write_jsonl(tmp_path / "trajectories.jsonl", [traj.to_dict()])

    class Short:
        def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
            return [[0.0] for _ in trajectories]

    with pytest.raises(ValueError, match="1 logits for the 2 actions"):
        score_eval_trajectories(Short(), tmp_path)
    assert not (tmp_path / "step_scores.jsonl").exists()
