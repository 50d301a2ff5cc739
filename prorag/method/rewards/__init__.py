"""Rewards of the RL stage, computed from token ids and action spans (METHOD.md section 2, stage 4).

* :mod:`prorag.method.rewards.outcome`: the outcome reward of Eq. 6, one number per trajectory
  (answer F1 plus a trajectory-format term);
* :mod:`prorag.method.rewards.process`: the step reward of Eq. 5, one number per action (the PRM's
  score plus a step-format term).

Each comes in the paper's form (the default) and in the public reference code's form, picked
by a small config (:class:`OutcomeRewardConfig`, :class:`StepRewardConfig`).
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
