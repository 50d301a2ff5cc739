"""Where the per-action (step) scores of an RL batch come from: the ``STEP_REWARD_SOURCES`` registry.

A source turns the trajectories of a batch (and their records, for sources that read the gold
evidence) into one raw score per action; Eq. 5 (:mod:`prorag.method.rewards.process`: form,
``nu1``) and ``prm_scope`` are applied afterwards by the trainer, whatever the source. A source
is built by a factory registered under its name (``RLConfig.process_reward``), called as
``factory(config, device=...)`` with the RL config; a factory returning ``None`` means no step
rewards (``"none"``: outcome only). The registry lives here, in the method layer, so that the
trainer (stages) and sources of any layer above (the learned PRM in
:mod:`prorag.supervision.step_rewards`, which registers ``"prm"`` on first look-up) reach it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prorag.agent.rollout import Trajectory
from prorag.core.registry import Registry
from prorag.data.records import Record
from prorag.method.rewards.process import StepScorer


class StepRewardSource(Protocol):
    """Raw per-action scores of a batch: one list per trajectory, one float per action, in order.
    ``records[i]`` is the question of ``trajectories[i]`` (``None`` where the caller has none)."""

    def __call__(self, trajectories: Sequence[Trajectory], records: Sequence[Record] | None = None) -> list[list[float]]: ...


#: ``factory(config, device=None)`` -> a source, or ``None`` for no step rewards.
StepRewardFactory = Callable[..., StepRewardSource | None]

#: Step-reward sources by name (``RLConfig.process_reward``).
STEP_REWARD_SOURCES: Registry[StepRewardFactory] = Registry("step reward source", builtins=("prorag.supervision.step_rewards",))


class ScorerSteps:
    """A :class:`~prorag.method.rewards.process.StepScorer` (a PRM, or a fake in tests) as a source:
    its ``score_trajectories``, with ``batch_size`` when the scorer takes one (a
    :class:`~prorag.supervision.reward_model.ProcessRewardModel` does, a bare scorer need not)."""

    def __init__(self, scorer: StepScorer, batch_size: int = 32) -> None:
        self.scorer = scorer
        self.batch_size = int(batch_size)

    def __call__(self, trajectories: Sequence[Trajectory], records: Sequence[Record] | None = None) -> list[list[float]]:
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


@STEP_REWARD_SOURCES.register("none")
def no_step_rewards(config: Any, *, device: str | None = None) -> None:
    """Outcome only (the GRPO baseline): no source, the trainer computes no step reward."""
    return None


__all__ = ["STEP_REWARD_SOURCES", "ScorerSteps", "StepRewardFactory", "StepRewardSource", "as_step_source", "no_step_rewards"]
