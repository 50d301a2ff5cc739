"""The step-reward sources backed by the supervision layer: ``prm`` (the learned PRM), ``oracle``
(the oracle judge's verdict on every step), ``oracle-first-error`` and ``prm-first-error`` (those
verdicts up to a trajectory's first error, none after), and the controls ``shuffled``,
``oracle-first-error-shuffled`` and ``prm-first-error-shuffled`` (the same scores permuted within
each group). They register in :data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES` when this
module is imported (the RL stage imports it; the registry, a layer below, cannot).

``oracle`` is the upper bound of what any PRM could give (the judge that labelled the PRM's training
pairs); a shuffled control keeps a source's reward distribution and removes its information, so a
gain over it is the information, not the reward's scale. The first-error sources exist because a
step that correctly follows a misread sub-answer "targets no open hop" too: judged on every step,
one reading error is blamed on every later step, and the cheapest escape is to stop searching.
Labelling up to the first error (as PRM800K and Math-Shepherd do) blames the step that erred; for
the PRM, its first step scored below 0 (its own decision boundary) is taken for the first error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prorag.agent.trajectory import Trajectory
from prorag.method.rewards.sources import (
    STEP_REWARD_SOURCES,
    GroupIds,
    Records,
    ScorerSteps,
    ShuffledSteps,
    StepRewardSource,
    StepScores,
)

#: The oracle source's raw score of a valid step, an invalid one, and one it cannot place (a
#: trajectory whose decoded text parses into other actions than its token-level ones).
ORACLE_VALID, ORACLE_INVALID, ORACLE_UNDECIDED = 1.0, -1.0, 0.0
#: The sources that score with the learned PRM at ``config.prm``.
LEARNED_PRM_SOURCES: tuple[str, ...] = ("prm", "shuffled", "prm-first-error", "prm-first-error-shuffled")


def _learned_prm(config: Any, device: str | None, name: str) -> ScorerSteps:
    """The frozen PRM saved at ``config.prm`` as a source (``name`` is the source asking, for the error)."""
    from prorag.supervision.reward_model import ProcessRewardModel

    if not config.prm:
        raise ValueError(f"process_reward={name!r} needs a PRM: pass `scorer` or set `prm` (or use process_reward='none')")
    return ScorerSteps(ProcessRewardModel.load(config.prm, device=device), config.prm_batch_size)


@STEP_REWARD_SOURCES.register("prm", help="ProRAG's learned PRM (the frozen `prm`), its logits through Eq. 5")
def prm_step_rewards(config: Any, *, device: str | None = None) -> ScorerSteps:
    """ProRAG's step scores: the frozen PRM saved at ``config.prm`` (any kind, read from its
    folder by :meth:`~prorag.supervision.reward_model.ProcessRewardModel.load`) on ``device``,
    scoring ``config.prm_batch_size`` inputs at a time."""
    return _learned_prm(config, device, "prm")


@STEP_REWARD_SOURCES.register("shuffled", help="the PRM's scores permuted within each group: the PRM's control")
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


def first_error_index(scores: Sequence[float], threshold: float = 0.0) -> int | None:
    """The index of the first score below ``threshold`` (a trajectory's first error), or None."""
    return next((i for i, s in enumerate(scores) if s < threshold), None)


def up_to_first_error(scores: Sequence[float], threshold: float = 0.0) -> list[float]:
    """``scores`` up to and including the first one below ``threshold`` (the first error: the
    oracle's :data:`ORACLE_INVALID`, -1; a PRM logit below 0), NaN after it: a step that follows
    an error is judged against a history already off the gold path, so its verdict says more
    about the earlier error than about itself; NaN is "no process reward" (the trainer leaves
    those tokens the outcome advantage alone). A score equal to ``threshold`` is no error (the
    oracle's :data:`ORACLE_UNDECIDED`, 0), nor is a NaN.

    >>> up_to_first_error([1.0, -1.0, 1.0])
    [1.0, -1.0, nan]
    """
    out = list(scores)
    first = first_error_index(out, threshold)
    if first is not None:
        out[first + 1 :] = [math.nan] * (len(out) - first - 1)
    return out


class FirstErrorSteps:
    """Another source's scores cut at each trajectory's first error (:func:`up_to_first_error`
    with ``threshold``): the first step scored below it keeps its score, the later ones get NaN."""

    def __init__(self, inner: StepRewardSource, threshold: float = 0.0) -> None:
        self.inner = inner
        self.threshold = float(threshold)

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores:
        return [up_to_first_error(row, self.threshold) for row in self.inner(trajectories, records, group_ids)]


@STEP_REWARD_SOURCES.register(
    "oracle", help="the oracle judge's +1/-1 verdict per step (needs gold decompositions): a PRM's upper bound"
)
def oracle_step_rewards(config: Any, *, device: str | None = None) -> OracleSteps:
    """The oracle judge's +1 / -1 per step (:class:`OracleSteps`): the upper bound of a PRM."""
    return OracleSteps()


@STEP_REWARD_SOURCES.register(
    "oracle-first-error", help="the oracle's verdicts up to a trajectory's first wrong step, none after"
)
def oracle_first_error_step_rewards(config: Any, *, device: str | None = None) -> OracleSteps:
    """The oracle's +1 / -1 up to a trajectory's first wrong step, no process reward after it
    (:func:`up_to_first_error`): the blame of an error on the step that made it."""
    return FirstErrorSteps(OracleSteps())


@STEP_REWARD_SOURCES.register(
    "oracle-first-error-shuffled", help="`oracle-first-error`'s scores permuted within each group: its control"
)
def shuffled_oracle_first_error_step_rewards(config: Any, *, device: str | None = None) -> ShuffledSteps:
    """The oracle arm's control: :func:`oracle_first_error_step_rewards`' scores (NaN after a first
    error included) permuted within each group, seeded by ``config.seed``. Where the oracle's step
    rewards change what RL does, this tells the verdicts' information apart from what any extra
    bounded term of the same distribution would do to the advantage (damp the outcome term, add
    variance); it needs no PRM."""
    return ShuffledSteps(FirstErrorSteps(OracleSteps()), seed=int(getattr(config, "seed", 0)))


@STEP_REWARD_SOURCES.register("prm-first-error", help="the PRM's scores up to the first step it scores below 0, none after")
def prm_first_error_step_rewards(config: Any, *, device: str | None = None) -> FirstErrorSteps:
    """The learned PRM's logits up to each trajectory's first step it scores below 0, no process
    reward after it: ``oracle-first-error`` with the PRM's verdicts in place of the oracle's. The
    PRM scores every step as ``oracle`` does, which blames one misread on every later step."""
    return FirstErrorSteps(_learned_prm(config, device, "prm-first-error"))


@STEP_REWARD_SOURCES.register(
    "prm-first-error-shuffled", help="`prm-first-error`'s scores permuted within each group: its control"
)
def shuffled_prm_first_error_step_rewards(config: Any, *, device: str | None = None) -> ShuffledSteps:
    """``prm-first-error``'s control: its scores (NaN after a first error included) permuted within
    each group, seeded by ``config.seed``, as ``oracle-first-error-shuffled`` is the oracle's."""
    return ShuffledSteps(
        FirstErrorSteps(_learned_prm(config, device, "prm-first-error-shuffled")), seed=int(getattr(config, "seed", 0))
    )


__all__ = [
    "LEARNED_PRM_SOURCES",
    "ORACLE_INVALID",
    "ORACLE_UNDECIDED",
    "ORACLE_VALID",
    "FirstErrorSteps",
    "OracleSteps",
    "oracle_first_error_step_rewards",
    "oracle_step_rewards",
    "prm_first_error_step_rewards",
    "prm_step_rewards",
    "shuffled_oracle_first_error_step_rewards",
    "shuffled_prm_first_error_step_rewards",
    "shuffled_step_rewards",
    "first_error_index",
    "up_to_first_error",
]
