"""The step reward of ProRAG's RL stage (docs/METHOD.md §2, Eq. 5): one number per action.

    paper (Eq. 5):   r_step = R_phi(c, s) + nu1 * I_step(s)          (R_phi: the PRM's logit)
    bounded:         r_step = sigmoid(R_phi(c, s)) + nu1 * I_step(s)
    reference code:  r_step = sigmoid(R_phi(c, s)) + (+1 if I_step(s) else -2)

The paper's form is :class:`StepRewardConfig`'s default; the RL stage defaults to ``bounded``
(``RLConfig.step_reward``). In the paper's form the raw logit is unbounded: a confident PRM can
outweigh the format bonus, and a few extreme logits dominate the group's step statistics. The
bounded form keeps Eq. 5's ``nu1`` and reads the PRM as the probability that the step is the
better one (the Bradley-Terry reading of Eq. 4), in (0, 1); the reference form also punishes a
malformed step below any well-formed one. ``I_step`` comes from the token-level actions
(:func:`~prorag.agent.schema.parse_token_actions`), never from text with special tokens stripped;
every action is rewarded, malformed ones included: they are the steps the format term must punish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from prorag.agent.trajectory import ActionRecord, Trajectory
from prorag.core.config import setting


@runtime_checkable
class StepScorer(Protocol):
    """Anything that scores the actions of trajectories (a process reward model, or a fake in
    tests): one logit per action of each trajectory, in action order."""

    def score_trajectories(self, trajectories: Sequence[Trajectory]) -> list[list[float]]: ...


StepForm = Literal["paper", "bounded", "reference"]
PRMScope = Literal["all", "reasoning"]

#: The forms of :class:`StepRewardConfig`.
STEP_FORMS: tuple[str, ...] = ("paper", "bounded", "reference")

#: The values of ``prm_scope`` (RFT's step filter, RL's process term).
PRM_SCOPES: tuple[str, ...] = ("all", "reasoning")

#: Reference code: the format term for a well-formed and for a malformed step.
REFERENCE_STEP_BONUS = 1.0
REFERENCE_STEP_PENALTY = -2.0


@dataclass
class StepRewardConfig:
    """Which form of Eq. 5 to compute, and its settings."""

    form: StepForm = setting(
        "paper",
        help='`"paper"`: `logit + nu1 * I_step`; `"bounded"`: `sigmoid(logit) + nu1 * I_step`; `"reference"`: '
        "`sigmoid(logit) + (1 if I_step else -2)`.",
    )
    nu1: float = setting(
        1.0, help="The paper's format coefficient; the paper gives no value, 1.0 is the reference code's +1 bonus."
    )

    def __post_init__(self) -> None:
        if self.form not in STEP_FORMS:
            raise ValueError(f"StepRewardConfig.form must be one of {STEP_FORMS}, got {self.form!r}")


def _sigmoid(x: float) -> float:
    """The logistic function, without overflow for large negative logits."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def step_reward(prm_logit: float, well_formed: bool, config: StepRewardConfig) -> float:
    """Eq. 5 for one step, in the configured form (the pure formula).

    >>> step_reward(0.5, True, StepRewardConfig(nu1=2.0))
    2.5
    >>> step_reward(0.0, False, StepRewardConfig(form="reference"))
    -1.5
    >>> step_reward(0.0, True, StepRewardConfig(form="bounded", nu1=2.0))
    2.5

    A NaN score is a source's "no process reward for this step" (``oracle-first-error`` after a
    trajectory's first error) and stays NaN: the trainer then leaves that step's tokens the
    outcome advantage alone. An infinite score is a bug in the source and is refused.
    """
    if math.isnan(prm_logit):
        return math.nan
    if not math.isfinite(prm_logit):
        raise ValueError(f"the PRM logit must be finite or NaN (no step reward), got {prm_logit}")
    if config.form == "paper":
        return float(prm_logit) + config.nu1 * float(well_formed)
    if config.form == "bounded":
        return _sigmoid(float(prm_logit)) + config.nu1 * float(well_formed)
    return _sigmoid(float(prm_logit)) + (REFERENCE_STEP_BONUS if well_formed else REFERENCE_STEP_PENALTY)


def step_rewards(prm_logits: Sequence[float], well_formed: Sequence[bool], config: StepRewardConfig | None = None) -> list[float]:
    """Eq. 5 for each step of one trajectory: one PRM logit and one I_step per action."""
    cfg = config or StepRewardConfig()
    if len(prm_logits) != len(well_formed):
        raise ValueError(f"{len(prm_logits)} PRM logits for {len(well_formed)} steps")
    return [step_reward(float(x), bool(ok), cfg) for x, ok in zip(prm_logits, well_formed, strict=True)]


def prm_judged_actions(actions: Sequence[ActionRecord], scope: PRMScope = "all") -> list[int]:
    """Indices of the actions whose PRM verdict counts under ``scope``.

    ``"all"`` (the paper): every action, the final answer included. ``"reasoning"``: every
    action but a well-formed answer, whose worth the outcome already measures (RFT only keeps
    trajectories with a correct answer; RL's outcome reward scores it). The PRM learns from
    MCTS siblings, which are almost all searches and conclusions; on answers it is out of its
    training distribution, and a likelihood-type PRM scores a yes/no answer, a coin flip for the
    policy, low however well the steps before it found the evidence. On the demo's RFT samples
    both PRM kinds rejected nearly every correct answer to a yes/no comparison while passing
    nearly every chain answer, so under ``"all"`` RFT all but never trained on a comparison's answer.
    A malformed answer stays judged: its format term is what must punish it.

    >>> from prorag.agent.rollout import ActionRecord
    >>> acts = [ActionRecord("search", (0, 3), True), ActionRecord("answer", (3, 5), True)]
    >>> prm_judged_actions(acts, "all"), prm_judged_actions(acts, "reasoning")
    ([0, 1], [0])
    """
    if scope not in PRM_SCOPES:
        raise ValueError(f"prm_scope must be one of {PRM_SCOPES}, got {scope!r}")
    return [i for i, a in enumerate(actions) if scope == "all" or not (a.kind == "answer" and a.well_formed)]


def trajectory_step_rewards(
    trajectories: Sequence[Trajectory], prm_logits: Sequence[Sequence[float]], config: StepRewardConfig | None = None
) -> list[list[float]]:
    """Per-trajectory lists of step rewards, given the PRM's logits (one per action of each
    trajectory, as :meth:`ProcessRewardModel.score_trajectories` returns them).

    I_step of each action is its token-level ``well_formed``. A trajectory without actions
    (an empty completion) gets an empty list. Raises ``ValueError`` when the logits do not
    match the actions (a bug in the caller, not malformed model output).
    """
    if len(trajectories) != len(prm_logits):
        raise ValueError(f"PRM logits for {len(prm_logits)} trajectories, expected {len(trajectories)}")
    out = []
    for traj, logits in zip(trajectories, prm_logits, strict=True):
        if len(logits) != len(traj.actions):
            raise ValueError(f"trajectory {traj.id!r}: {len(logits)} PRM logits for {len(traj.actions)} actions")
        out.append(step_rewards(logits, [a.well_formed for a in traj.actions], config))
    return out


def score_step_rewards(
    scorer: StepScorer, trajectories: Sequence[Trajectory], config: StepRewardConfig | None = None
) -> list[list[float]]:
    """Score every action with the PRM (any object with ``score_trajectories``) and turn the
    logits into step rewards (:func:`trajectory_step_rewards`)."""
    trajs = list(trajectories)
    return trajectory_step_rewards(trajs, scorer.score_trajectories(trajs), config)


__all__ = [
    "PRM_SCOPES",
    "PRMScope",
    "REFERENCE_STEP_BONUS",
    "REFERENCE_STEP_PENALTY",
    "STEP_FORMS",
    "StepForm",
    "StepRewardConfig",
    "prm_judged_actions",
    "score_step_rewards",
    "step_reward",
    "step_rewards",
    "trajectory_step_rewards",
]
