"""The step-reward sources backed by the supervision layer: ``"prm"`` (the learned PRM),
``"oracle"`` (the oracle judge's verdict on every step), ``"oracle-first-error"`` (its verdicts up to
a trajectory's first wrong step, none after), ``"shuffled"`` (the PRM's scores permuted within
each group: the control arm) and ``"oracle-first-error-shuffled"`` (the oracle's, permuted the same
way: the oracle's control).

Imported by :data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES` on its first look-up, so
that ``RLConfig.process_reward: prm`` (or ``oracle``, ``shuffled``) finds the factory below
without the registry (method layer) importing upwards.

Together they make "does process supervision help?" answerable: ``oracle`` is the upper bound
of what any PRM could give (the judge that labelled the PRM's training pairs, on every step of
the RL samples), ``shuffled`` keeps the PRM's reward distribution and removes its information,
so a gain of ``prm`` over ``shuffled`` is the PRM's information, not its reward scale.

``oracle-first-error`` exists because the oracle judges every step against the gold path: after a
misread sub-answer the policy's next search, which correctly follows what it wrote, "targets no
open hop" and gets -1 too, so the blame for one reading error lands on every later step and the
cheapest way to avoid it is to stop searching (docs/LOG.md). Labelling up to the first error (as
PRM800K and Math-Shepherd label solutions) puts the blame on the step that made the error; the
later steps keep the outcome advantage alone.
"""

from __future__ import annotations

import math
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

    def __init__(self, first_error_only: bool = False) -> None:
        #: Steps after a trajectory's first invalid one get NaN (:func:`up_to_first_error`).
        self.first_error_only = first_error_only

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
                scores = [ORACLE_VALID if ok else ORACLE_INVALID for ok, _ in verdicts]
                out.append(up_to_first_error(scores) if self.first_error_only else scores)
        return out


def up_to_first_error(scores: Sequence[float]) -> list[float]:
    """``scores`` up to and including the first :data:`ORACLE_INVALID`, NaN after it: a step that
    follows an error is judged against a history already off the gold path, so its verdict says
    more about the earlier error than about itself; NaN is "no process reward" (the trainer
    leaves those tokens the outcome advantage alone)."""
    out = list(scores)
    first = next((i for i, s in enumerate(out) if s == ORACLE_INVALID), None)
    if first is not None:
        out[first + 1 :] = [math.nan] * (len(out) - first - 1)
    return out


@STEP_REWARD_SOURCES.register("oracle")
def oracle_step_rewards(config: Any, *, device: str | None = None) -> OracleSteps:
    """The oracle judge's +1 / -1 per step (:class:`OracleSteps`): the upper bound of a PRM."""
    return OracleSteps()


@STEP_REWARD_SOURCES.register("oracle-first-error")
def oracle_first_error_step_rewards(config: Any, *, device: str | None = None) -> OracleSteps:
    """The oracle's +1 / -1 up to a trajectory's first wrong step, no process reward after it
    (:func:`up_to_first_error`): the blame of an error on the step that made it."""
    return OracleSteps(first_error_only=True)


@STEP_REWARD_SOURCES.register("oracle-first-error-shuffled")
def shuffled_oracle_first_error_step_rewards(config: Any, *, device: str | None = None) -> ShuffledSteps:
    """The oracle arm's control: :func:`oracle_first_error_step_rewards`' scores (NaN after a first
    error included) permuted within each group, seeded by ``config.seed``. Where the oracle's step
    rewards change what RL does, this tells the verdicts' information apart from what any extra
    bounded term of the same distribution would do to the advantage (damp the outcome term, add
    variance); it needs no PRM."""
    return ShuffledSteps(OracleSteps(first_error_only=True), seed=int(getattr(config, "seed", 0)))


__all__ = [
    "ORACLE_INVALID",
    "ORACLE_UNDECIDED",
    "ORACLE_VALID",
    "OracleSteps",
    "oracle_first_error_step_rewards",
    "oracle_step_rewards",
    "prm_step_rewards",
    "shuffled_oracle_first_error_step_rewards",
    "shuffled_step_rewards",
    "up_to_first_error",
]
