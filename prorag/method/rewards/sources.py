"""Where the per-action (step) scores of an RL batch come from: the ``STEP_REWARD_SOURCES`` registry.

A source turns the trajectories of a batch (and their records, for sources that read the gold
evidence, and their group ids, for sources that compare a question's G trajectories) into one raw
score per action; Eq. 5 (:mod:`prorag.method.rewards.process`: form, ``nu1``) and ``prm_scope`` are
applied afterwards by the trainer, whatever the source. A source is built by a factory registered
under its name (``RLConfig.process_reward``), called as ``factory(config, device=...)`` with the RL
config, where a source registered with ``config=`` finds its own settings (``config.cpsearch``); a
factory returning ``None`` means no step rewards (``"none"``: outcome only). A source whose ``final``
attribute is true returns step rewards, not logits: no Eq. 5, and ``NaN`` reads as "no step reward".

The registry lives in the method layer, so that the trainer (stages) and sources of any layer reach
it; it loads this layer's sources itself (``cpsearch``). The supervision layer's (``prm``,
``oracle``, ``shuffled``, the first-error ones: :mod:`prorag.supervision.step_rewards`) register when
that module is imported, which the RL stage does: a lower layer never imports a higher one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prorag.agent.trajectory import Trajectory
from prorag.core.registry import Registry
from prorag.data.records import Record
from prorag.method.rewards.process import StepScorer

#: A source's optional arguments and its result: one record and one group id per trajectory;
#: one list of per-action scores per trajectory.
Records = Sequence[Record] | None
GroupIds = Sequence[int] | None
StepScores = list[list[float]]


class StepRewardSource(Protocol):
    """Raw per-action scores of a batch: one list per trajectory, one float per action, in order.
    ``records[i]`` is the question of ``trajectories[i]`` and ``group_ids[i]`` its group (the G
    trajectories of one question share one; ``None`` where the caller has none)."""

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores: ...


#: ``factory(config, device=None)`` -> a source, or ``None`` for no step rewards.
StepRewardFactory = Callable[..., StepRewardSource | None]

#: Step-reward sources by name (``RLConfig.process_reward``).
STEP_REWARD_SOURCES: Registry[StepRewardFactory] = Registry("step reward source", builtins=("prorag.method.rewards.cpsearch",))


class ScorerSteps:
    """A :class:`~prorag.method.rewards.process.StepScorer` (a PRM, or a fake in tests) as a source:
    its ``score_trajectories``, with ``batch_size`` when the scorer takes one (a
    :class:`~prorag.supervision.reward_model.ProcessRewardModel` does, a bare scorer need not)."""

    def __init__(self, scorer: StepScorer, batch_size: int = 32) -> None:
        self.scorer = scorer
        self.batch_size = int(batch_size)

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores:
        try:
            return self.scorer.score_trajectories(list(trajectories), batch_size=self.batch_size)  # type: ignore[call-arg]
        except TypeError:
            return self.scorer.score_trajectories(list(trajectories))


def as_step_source(scorer: Any, batch_size: int = 32) -> StepRewardSource:
    """``scorer`` as a source: a :class:`StepScorer` is wrapped (:class:`ScorerSteps`), a source
    (any callable) is kept as it is."""
    if isinstance(scorer, StepScorer):
        return ScorerSteps(scorer, batch_size)
    if callable(scorer):
        return scorer
    raise TypeError(f"{type(scorer).__name__} is neither a step-reward source nor has score_trajectories")


def shuffle_within_groups(scores: Sequence[Sequence[float]], group_ids: Sequence[int], rng: random.Random) -> list[list[float]]:
    """``scores`` (one list per trajectory) with the scores of each group's steps permuted among
    that group's steps (pooled over its trajectories), each trajectory keeping its number of
    actions: the group's step rewards keep their values, and so their statistics and their
    spread in the advantage, but no longer say which step earned which.

    >>> shuffle_within_groups([[1.0, 2.0], [3.0], [9.0]], [0, 0, 1], random.Random(0))
    [[1.0, 3.0], [2.0], [9.0]]
    """
    if len(scores) != len(group_ids):
        raise ValueError(f"{len(group_ids)} group ids for {len(scores)} trajectories")
    out = [list(map(float, row)) for row in scores]
    for group in sorted(set(group_ids), key=str):
        rows = [i for i, g in enumerate(group_ids) if g == group]
        pooled = [x for i in rows for x in out[i]]
        rng.shuffle(pooled)
        for i in rows:
            out[i], pooled = pooled[: len(out[i])], pooled[len(out[i]) :]
    return out


class ShuffledSteps:
    """The control arm: another source's scores (the learned PRM's, the oracle's) permuted within
    each group by :func:`shuffle_within_groups`, from a stream seeded by ``seed`` and the call's
    index (each batch its own permutation, the same run the same permutations). Needs ``group_ids``."""

    def __init__(self, inner: StepRewardSource, seed: int = 0) -> None:
        self.inner = inner
        self.seed = int(seed)
        self.calls = 0

    def __call__(self, trajectories: Sequence[Trajectory], records: Records = None, group_ids: GroupIds = None) -> StepScores:
        if group_ids is None:
            raise ValueError("a shuffled step-reward source permutes scores within groups: the caller must pass group_ids")
        scores = self.inner(trajectories, records)
        rng = random.Random(f"prorag-shuffled-steps/{self.seed}/{self.calls}")
        self.calls += 1
        return shuffle_within_groups(scores, group_ids, rng)


@STEP_REWARD_SOURCES.register("none", help="outcome only, the GRPO baseline: no step reward, no PRM called, `beta` ignored")
def no_step_rewards(config: Any, *, device: str | None = None) -> None:
    """Outcome only (the GRPO baseline): no source, the trainer computes no step reward."""
    return None


__all__ = [
    "STEP_REWARD_SOURCES",
    "GroupIds",
    "Records",
    "StepScores",
    "ScorerSteps",
    "ShuffledSteps",
    "StepRewardFactory",
    "StepRewardSource",
    "as_step_source",
    "no_step_rewards",
    "shuffle_within_groups",
]
