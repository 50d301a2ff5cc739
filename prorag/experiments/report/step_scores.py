"""PRM step scores of evaluated trajectories: ``step_scores.jsonl`` beside an evaluation's
``trajectories.jsonl``, one logit per action, which the trajectory viewer shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from prorag.agent.trajectory import Trajectory
from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl_numbered, write_jsonl
from prorag.supervision.reward_model import StepScorer


def score_eval_trajectories(scorer: StepScorer, eval_dir: Path, batch_size: int = 32) -> Path:
    """Score every action of ``eval_dir/trajectories.jsonl`` with the PRM; write ``step_scores.jsonl``.

    One row per trajectory, ``{"id": question id, "logits": [one float per action]}``, in the
    order of the trajectories file, written atomically (a crash leaves no partial file that the
    report would take for a finished one). ``batch_size`` trajectories go to the scorer at a
    time: any :class:`~prorag.supervision.reward_model.StepScorer` works (its ``score_trajectories`` takes
    the trajectories only), and the progress bar moves per batch.
    """
    eval_dir = Path(eval_dir)
    source = eval_dir / "trajectories.jsonl"
    trajectories = []
    for lineno, row in numbered_rows(source):
        try:
            trajectories.append(Trajectory.from_dict(row))
        except (KeyError, TypeError) as e:
            raise DataError(f"{source}:{lineno}", f"not a trajectory ({e})") from None
    rows: list[dict[str, Any]] = []
    for start in tqdm(range(0, len(trajectories), batch_size), desc=f"PRM scores {eval_dir.name}", unit="batch"):
        batch = trajectories[start : start + batch_size]
        logits = scorer.score_trajectories(batch)
        if len(logits) != len(batch):
            raise ValueError(f"the scorer returned {len(logits)} score lists for {len(batch)} trajectories")
        for traj, row in zip(batch, logits, strict=True):
            if len(row) != len(traj.actions):
                raise ValueError(f"the scorer returned {len(row)} logits for the {len(traj.actions)} actions of {traj.id}")
            rows.append({"id": traj.id, "logits": [float(x) for x in row]})
    out = eval_dir / "step_scores.jsonl"
    write_jsonl(out, rows)
    return out


def numbered_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of a JSONL file written by an evaluation, a truncated last line
    (a run killed while writing) tolerated."""
    return list(read_jsonl_numbered(path, tolerate_truncated_tail=True))
