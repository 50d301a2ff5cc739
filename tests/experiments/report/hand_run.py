"""A run written by hand for the report tests: a hostile thought, a fake PRM, hand-made
trajectories and systems, and a reader of the Markdown table's rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prorag.agent.schema import Action, ActionKind, render_trajectory
from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.data.jsonl import write_json, write_jsonl
from prorag.data.records import Record
from prorag.evaluation.harness import score, summarise

#: A thought written by an adversarial model: it must reach the page as text, never as markup.
HOSTILE = '<script>alert("pwned")</script> & <img src=x onerror=alert(1)>'


class KindScorer:
    """A fake PRM: the logit of an action depends on its kind and position (hand-checkable)."""

    LOGIT = {"search": 2.0, "conclude": 0.5, "answer": -1.0, None: -3.0}

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        self.calls.append(len(trajectories))
        return [[self.LOGIT[a.kind] + 0.25 * i for i, a in enumerate(t.actions)] for t in trajectories]


def hand_trajectory(qid: str, question: str, actions: list[Action], text: str | None = None) -> Trajectory:
    """A trajectory written by hand: text from the schema's renderer, token spans that only count actions."""
    text = render_trajectory(actions) if text is None else text
    records = [ActionRecord(a.kind.value if a.kind else None, (2 * i, 2 * i + 1), True) for i, a in enumerate(actions)]
    searches = [
        {"query": a.content, "doc_ids": [f"{qid}-d{i}"], "action": i}
        for i, a in enumerate(actions)
        if a.kind is ActionKind.SEARCH
    ]
    return Trajectory(
        id=qid,
        question=question,
        prompt_ids=[1, 2],
        completion_ids=list(range(2 * len(actions))),
        env_mask=[1] * (2 * len(actions)),
        logprobs=[0.0] * (2 * len(actions)),
        actions=records,
        retrievals=searches,
        stop_reason="answer",
        text=text,
        answer=actions[-1].content if actions and actions[-1].kind is ActionKind.ANSWER else None,
        valid=True,
    )


def hand_system(eval_dir: Path, records: list[Record]) -> dict[str, Any]:
    """A second system with hand-written trajectories: one wrong answer with a hostile thought, one
    right answer; predictions scored by the evaluation harness's own ``score``."""
    r0, r1 = records[0], records[1]
    t0 = hand_trajectory(
        r0.id,
        r0.question,
        [
            Action(
                ActionKind.SEARCH,
                HOSTILE,
                "who <b>is</b> it",
                retrieval="Doc 1(Title: Alpha) alpha text\nDoc 2(Title: Beta) b < c",
            ),
            Action(ActionKind.ANSWER, "so it is", "Nobody"),
        ],
    )
    t1 = hand_trajectory(r1.id, r1.question, [Action(ActionKind.ANSWER, "I know it", r1.golden_answers[0])])
    preds = [score(r, t, t.answer) for r, t in ((r0, t0), (r1, t1))]
    write_jsonl(eval_dir / "trajectories.jsonl", [t0.to_dict(), t1.to_dict()])
    write_jsonl(eval_dir / "predictions.jsonl", preds)
    metrics = summarise(preds)
    write_json(eval_dir / "metrics.json", metrics)
    return metrics


def md_row(md: str, label: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is ``label``."""
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]
