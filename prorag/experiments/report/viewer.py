"""The data of the trajectory viewer: each test question with its steps, the PRM score of each
step, the documents each search retrieved, the gold answers, the prediction and its EM/F1.

**Steps come from the schema's parser.** A completion is cut into actions with
:func:`prorag.agent.schema.parse_trajectory`, the parser every stage uses, and the i-th action
is paired with the i-th PRM logit of ``step_scores.jsonl`` (the PRM scores the token-level
actions, which the same state machine cuts identically).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from prorag.agent.schema import parse_trajectory
from prorag.agent.trajectory import Trajectory
from prorag.core.errors import DataError
from prorag.data.jsonl import read_jsonl
from prorag.experiments.report.step_scores import numbered_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ViewerStep:
    """One action of a trajectory as the viewer shows it."""

    kind: str
    """search | conclude | answer | malformed (an action with no action tag)."""
    thought: str
    content: str
    """The sub-query, sub-answer or answer."""
    well_formed: bool
    errors: tuple[str, ...]
    logit: float | None
    """The PRM's logit of this step, ``None`` when the system was not scored."""
    documents: tuple[str, ...] = ()
    """The retrieved documents after a search, one per entry (``Doc i(Title: t) text``)."""
    doc_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuestionView:
    """One test question of one system: the prediction, its scores and the trajectory's steps."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    prediction: str | None
    em: float | None
    f1: float | None
    format_valid: bool | None
    stop_reason: str | None
    steps: tuple[ViewerStep, ...] = ()
    prior_doc_ids: tuple[str, ...] = ()
    """Documents retrieved before generation (standard RAG puts them in the prompt)."""


_DOC_START = re.compile(r"(?m)^(?=Doc \d+\(Title: )")


def split_documents(retrieval: str | None) -> tuple[str, ...]:
    """A retrieval block's documents, one per entry (they start ``Doc i(Title: …)`` on a new line,
    the layout of :func:`prorag.retrieval.base.format_documents`)."""
    if not retrieval:
        return ()
    return tuple(part.strip() for part in _DOC_START.split(retrieval) if part.strip())


def trajectory_steps(traj: Trajectory, logits: Sequence[float] | None = None) -> list[ViewerStep]:
    """The steps of a trajectory, parsed from its text by :func:`prorag.agent.schema.parse_trajectory`.

    The i-th parsed action gets the i-th PRM logit (both parsers cut a completion into the same
    actions); if the counts differ (a text decoded lossily) the extra actions show no score rather
    than a wrong one. A search's document ids come from ``traj.retrievals`` (matched by action index).
    """
    parsed = parse_trajectory(traj.text)
    ids_of = {int(r.get("action", -1)): tuple(str(d) for d in r.get("doc_ids") or ()) for r in traj.retrievals}
    scores = list(logits or [])
    if logits is not None and len(scores) != len(parsed.actions):
        log.warning("%s: %d PRM scores for %d parsed actions", traj.id, len(scores), len(parsed.actions))
    steps = []
    for i, action in enumerate(parsed.actions):
        steps.append(
            ViewerStep(
                kind=action.kind.value if action.kind else "malformed",
                thought=action.thought,
                content=action.content,
                well_formed=action.well_formed,
                errors=action.errors,
                logit=float(scores[i]) if i < len(scores) and len(scores) == len(parsed.actions) else None,
                documents=split_documents(action.retrieval),
                doc_ids=ids_of.get(i, ()),
            )
        )
    return steps


def load_questions(eval_dir: Path, limit: int | None = None) -> list[QuestionView]:
    """The viewer's questions of one system: predictions joined with trajectories and step scores.

    ``predictions.jsonl`` sets the questions and their order; ``trajectories.jsonl`` and
    ``step_scores.jsonl`` are optional (a question without a trajectory shows its prediction only).
    """
    eval_dir = Path(eval_dir)
    pred_path = eval_dir / "predictions.jsonl"
    if not pred_path.is_file():
        return []
    predictions = list(read_jsonl(pred_path, tolerate_truncated_tail=True))[:limit]
    wanted = {str(p.get("id")) for p in predictions}
    trajectories: dict[str, Trajectory] = {}
    traj_path = eval_dir / "trajectories.jsonl"
    if traj_path.is_file():
        for lineno, row in numbered_rows(traj_path):
            if str(row.get("id")) in wanted:
                try:
                    trajectories[str(row["id"])] = Trajectory.from_dict(row)
                except (KeyError, TypeError) as e:
                    raise DataError(f"{traj_path}:{lineno}", f"not a trajectory ({e})") from None
    scores: dict[str, list[float]] = {}
    score_path = eval_dir / "step_scores.jsonl"
    if score_path.is_file():
        scores = {
            str(r["id"]): [float(x) for x in r.get("logits", [])] for r in read_jsonl(score_path, tolerate_truncated_tail=True)
        }
    out = []
    for p in predictions:
        qid = str(p.get("id"))
        traj = trajectories.get(qid)
        out.append(
            QuestionView(
                id=qid,
                question=str(p.get("question", traj.question if traj else "")),
                golden_answers=tuple(str(g) for g in p.get("golden_answers") or ()),
                prediction=None if p.get("prediction") is None else str(p["prediction"]),
                em=p.get("em"),
                f1=p.get("f1"),
                format_valid=p.get("format_valid"),
                stop_reason=p.get("stop_reason", traj.stop_reason if traj else None),
                steps=tuple(trajectory_steps(traj, scores.get(qid))) if traj else (),
                prior_doc_ids=tuple(
                    d for r in (traj.retrievals if traj else []) if r.get("action", -1) < 0 for d in r["doc_ids"]
                ),
            )
        )
    return out


def sigmoid(x: float) -> float:
    """The logistic function, safe for any float (no overflow for large |x|)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def score_colour(logit: float) -> str:
    """A step's colour: red (sigmoid 0) through yellow (0.5) to green (1), as an HSL hue."""
    return f"hsl({120.0 * sigmoid(logit):.0f}, 75%, 82%)"
