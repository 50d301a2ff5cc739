"""Rewards of the RL stage, computed from token ids and action spans (docs/METHOD.md §2, stage 4).

:mod:`~prorag.method.rewards.outcome` gives Eq. 6 per trajectory, :mod:`~prorag.method.rewards.process`
Eq. 5 per action; each in the paper's form (default) or the reference code's
(:class:`OutcomeRewardConfig`, :class:`StepRewardConfig`). Part of the method layer: imports only
core .. models.
"""

from prorag.method.rewards.outcome import (
    OutcomeRewardConfig,
    outcome_reward,
    outcome_rewards,
    outcome_value,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.method.rewards.process import (
    StepRewardConfig,
    score_step_rewards,
    step_reward,
    step_rewards,
    trajectory_step_rewards,
)

__all__ = [
    "OutcomeRewardConfig",
    "StepRewardConfig",
    "outcome_reward",
    "outcome_rewards",
    "outcome_value",
    "score_step_rewards",
    "step_reward",
    "step_rewards",
    "trajectory_answer",
    "trajectory_format_valid",
    "trajectory_step_rewards",
]
