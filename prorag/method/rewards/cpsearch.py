"""CP-Search's chain progressive process reward (docs/METHOD.md §5): the step-reward source ``"cpsearch"``.

Each retrieval ``t`` is valid (``Delta_t = 1``) iff its documents hold gold evidence for a hop not
yet resolved (:func:`retrieval_validity`); two accumulators, ``gamma_plus`` (from 1) and
``gamma_minus`` (from -1), grow with every valid and every invalid retrieval (the paper's ``alpha``
and ``beta``), and the retrieval's reward is ``pr_t = gamma_plus * Delta_t + gamma_minus * (1 - Delta_t)``,
read *after* step ``t``'s update (:func:`progressive_rewards`): a chain of valid (invalid)
retrievals earns more (loses more) at every link. ``pr_t`` goes to the actions of the segment that
ends at retrieval ``t`` (Eq. 4, :func:`segment_rewards`).

A trajectory without retrievals has no process reward: its actions get ``NaN``, read by the trainer
as "no step" (their tokens keep the outcome advantage ``A_out``). The scores are final step
rewards, not PRM logits: the source sets ``final = True`` and the trainer does not apply Eq. 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prorag.agent.trajectory import Trajectory
from prorag.core.config import setting
from prorag.data.records import Record
from prorag.method.rewards.sources import STEP_REWARD_SOURCES, GroupIds, Records, StepScores

#: The score of an action without a process reward (a trajectory that never retrieved).
NO_PROCESS_REWARD = math.nan


@dataclass
class CPSearchConfig:
    """The accumulators of CP-Search's progressive reward (Eq. 3; the paper's values)."""

    alpha: float = setting(0.2, help="Added to `gamma_plus` at every valid retrieval (the paper's 0.2).")
    beta: float = setting(-0.3, help="Added to `gamma_minus` at every invalid retrieval (the paper's -0.3).")
    gamma_plus: float = setting(1.0, help="Initial value of the valid-retrieval accumulator (the paper's 1).")
    gamma_minus: float = setting(-1.0, help="Initial value of the invalid-retrieval accumulator (the paper's -1).")


def progressive_rewards(deltas: Sequence[int | bool], config: CPSearchConfig | None = None) -> list[float]:
    """``pr_t`` of each retrieval from its validity ``Delta_t`` (Eq. 3, the accumulators updated
    before ``pr_t`` is read).

    >>> [round(x, 6) for x in progressive_rewards([1, 1, 0, 1, 0])]
    [1.2, 1.4, -1.3, 1.6, -1.6]
    """
    cfg = config or CPSearchConfig()
    plus, minus, out = cfg.gamma_plus, cfg.gamma_minus, []
    for d in deltas:
        delta = float(bool(d))
        plus += cfg.alpha * delta
        minus += cfg.beta * (1.0 - delta)
        out.append(plus * delta + minus * (1.0 - delta))
    return out


def hop_evidence(record: Record) -> list[set[str]]:
    """The gold passage ids of each hop of ``record``: its decomposition's ``doc_ids`` when every
    hop has some (the built-in world, MuSiQue), else one hop per ``gold_doc_ids`` entry (HotpotQA,
    2Wiki: one supporting paragraph per hop); raises ``ValueError`` when it has neither."""
    hops = [set(map(str, h.get("doc_ids") or [])) for h in record.metadata.get("decomposition") or []]
    if hops and all(hops):
        return hops
    gold = [str(x) for x in record.metadata.get("gold_doc_ids") or []]
    if gold:
        return [{x} for x in dict.fromkeys(gold)]
    raise ValueError(
        f"process_reward='cpsearch': record {record.id!r} has no gold evidence "
        "(metadata.decomposition[*].doc_ids or metadata.gold_doc_ids)"
    )


def retrieval_validity(retrieved: Sequence[Sequence[str]], hops: Sequence[set[str]]) -> list[int]:
    """``Delta_t`` of each retrieval (its passage ids, in order): 1 iff it holds evidence of a hop
    no earlier retrieval resolved; every hop whose evidence it holds is then resolved.
    Re-retrieving a resolved hop's evidence is not progress, so a policy cannot farm the reward
    by repeating its first search.

    >>> retrieval_validity([["a"], ["a"], ["x"], ["b", "a"]], [{"a"}, {"b"}])
    [1, 0, 0, 1]
    """
    resolved = [False] * len(hops)
    out = []
    for docs in retrieved:
        ids = set(map(str, docs))
        hit = [h for h, evidence in enumerate(hops) if not resolved[h] and evidence & ids]
        for h in hit:
            resolved[h] = True
        out.append(int(bool(hit)))
    return out


def segment_rewards(num_actions: int, retrieval_actions: Sequence[int], rewards: Sequence[float]) -> list[float]:
    """One score per action: each action gets the ``pr`` of the first retrieval issued at or after
    it (the segment ending there), actions after the last retrieval (its conclusion, the answer)
    the last one's, since Eq. 4 labels the trajectory's last token with the last checkpoint, and
    every action :data:`NO_PROCESS_REWARD` when there is no retrieval.

    >>> segment_rewards(6, [0, 2], [1.2, -1.3])
    [1.2, -1.3, -1.3, -1.3, -1.3, -1.3]
    >>> segment_rewards(2, [], [])
    [nan, nan]
    """
    if len(retrieval_actions) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards for {len(retrieval_actions)} retrievals")
    if not rewards:
        return [NO_PROCESS_REWARD] * num_actions
    out, r = [], 0
    for a in range(num_actions):
        while r < len(retrieval_actions) - 1 and retrieval_actions[r] < a:
            r += 1
        out.append(float(rewards[r]))
    return out


def cpsearch_action_rewards(traj: Trajectory, record: Record, config: CPSearchConfig | None = None) -> list[float]:
    """CP-Search's score of every action of ``traj`` (see the module docstring)."""
    retrievals = sorted(traj.retrievals, key=lambda r: int(r["action"]))
    deltas = retrieval_validity([r["doc_ids"] for r in retrievals], hop_evidence(record))
    return segment_rewards(len(traj.actions), [int(r["action"]) for r in retrievals], progressive_rewards(deltas, config))


class CPSearchSteps:
    """The ``"cpsearch"`` source: :func:`cpsearch_action_rewards` of each trajectory against its record."""

    #: The scores are step rewards already (the trainer applies no Eq. 5 to them).
    final = True

    def __init__(self, config: CPSearchConfig | None = None) -> None:
        self.config = config or CPSearchConfig()

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores:
        if records is None or len(records) != len(trajectories):
            raise ValueError("process_reward='cpsearch' needs the record (gold evidence) of every trajectory")
        return [cpsearch_action_rewards(t, r, self.config) for t, r in zip(trajectories, records, strict=True)]


@STEP_REWARD_SOURCES.register(
    "cpsearch",
    config=CPSearchConfig,
    help="CP-Search's chain progressive reward from gold evidence per hop (pair with `advantage: cpgrpo`)",
)
def cpsearch_step_rewards(config: Any, *, device: str | None = None) -> CPSearchSteps:
    """CP-Search's chain progressive reward (:class:`CPSearchSteps`), with ``config.cpsearch``'s accumulators
    (its section of the RL config, :class:`CPSearchConfig`)."""
    return CPSearchSteps(getattr(config, "cpsearch", None))


__all__ = [
    "NO_PROCESS_REWARD",
    "CPSearchConfig",
    "CPSearchSteps",
    "cpsearch_action_rewards",
    "cpsearch_step_rewards",
    "hop_evidence",
    "progressive_rewards",
    "retrieval_validity",
    "segment_rewards",
]
