"""The step-reward sources backed by the supervision layer: ``"prm"`` (the learned PRM),
``"oracle"`` (the oracle judge's verdict on every step) and ``"shuffled"`` (the PRM's scores
permuted within each group: the control arm).

Imported by :data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES` on its first look-up, so
that ``RLConfig.process_reward: prm`` (or ``oracle``, ``shuffled``) finds the factory below
without the registry (method layer) importing upwards.

Together they make "does process supervision help?" answerable: ``oracle`` is the upper bound
of what any PRM could give (the judge that labelled the PRM's training pairs, on every step of
the RL samples), ``shuffled`` keeps the PRM's reward distribution and removes its information,
so a gain of ``prm`` over ``shuffled`` is the PRM's information, not its reward scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prorag.agent.rollout import Trajectory
from prorag.method.rewards.sources import STEP_REWARD_SOURCES, GroupIds, Records, ScorerSteps, ShuffledSteps, StepScores

#: The oracle source's raw score of a valid step, an invalid one, and one it cannot place (a
#: trajectory whose decoded text parses into other actions than its token-level ones).
ORACLE_VALID, ORACLE_INVALID, ORACLE_UNDECIDED = 1.0, -1.0, 0.0


def _learned_prm(config: Any, device: str | None, name: str) -> ScorerSteps:
    """The frozen PRM saved at ``config.prm`` as a source (``name`` is the source asking, for the error)."""
    from prorag.supervision.reward_model import ProcessRewardModel

    if not config.prm:
        raise ValueError(f"process_reward={name!r} needs a PRM: pass `scorer` or set `prm` (or use process_reward='none')")
    return ScorerSteps(ProcessRewardModel.load(config.prm, device=device), config.prm_batch_size)


@STEP_REWARD_SOURCES.register("prm")
def prm_step_rewards(config: Any, *, device: str | None = None) -> ScorerSteps:
    """ProRAG's step scores: the frozen PRM saved at ``config.prm`` (any kind, read from its
    folder by :meth:`~prorag.supervision.reward_model.ProcessRewardModel.load`) on ``device``,
    scoring ``config.prm_batch_size`` inputs at a time."""
    return _learned_prm(config, device, "prm")


@STEP_REWARD_SOURCES.register("shuffled")
def shuffled_step_rewards(config: Any, *, device: str | None = None) -> ShuffledSteps:
    """The control arm: the PRM at ``config.prm`` scores every step, then the scores are
    permuted within each group of G trajectories (:class:`~prorag.method.rewards.sources.ShuffledSteps`,
    seeded by ``config.seed``)."""
    return ShuffledSteps(_learned_prm(config, device, "shuffled"), seed=int(getattr(config, "seed", 0)))


class OracleSteps:
    """The oracle judge's verdict on every action (:func:`~prorag.supervision.judge.trajectory_verdicts`,
    each action judged after the ones before it, the rule that labelled the MCTS pairs):
    :data:`ORACLE_VALID` or :data:`ORACLE_INVALID`, bounded by construction;
    :data:`ORACLE_UNDECIDED` on every action of a trajectory whose decoded text parses into a
    different number of actions than its token-level ones (the verdicts could not be paired).
    Needs every record's gold decomposition (``metadata.decomposition``: the built-in world,
    MuSiQue)."""

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores:
        from prorag.supervision.judge import trajectory_verdicts

        if records is None or len(records) != len(trajectories):
            raise ValueError("process_reward='oracle' needs the record (gold decomposition) of every trajectory")
        out = []
        for traj, record in zip(trajectories, records, strict=True):
            if not record.metadata.get("decomposition"):
                raise ValueError(
                    f"process_reward='oracle': record {record.id!r} has no gold decomposition (metadata.decomposition); "
                    "the oracle judges the built-in world's and MuSiQue's questions only"
                )
            verdicts = trajectory_verdicts(record, traj.text)
            if len(verdicts) != len(traj.actions):
                out.append([ORACLE_UNDECIDED] * len(traj.actions))
            else:
                out.append([ORACLE_VALID if ok else ORACLE_INVALID for ok, _ in verdicts])
        return out


@STEP_REWARD_SOURCES.register("oracle")
def oracle_step_rewards(config: Any, *, device: str | None = None) -> OracleSteps:
    """The oracle judge's +1 / -1 per step (:class:`OracleSteps`): the upper bound of a PRM."""
    return OracleSteps()


__all__ = [
    "ORACLE_INVALID",
    "ORACLE_UNDECIDED",
    "ORACLE_VALID",
    "OracleSteps",
    "oracle_step_rewards",
    "prm_step_rewards",
    "shuffled_step_rewards",
]
