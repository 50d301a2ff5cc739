"""The rewards of one generation batch, read from token ids: the reward function TRL logs and
:func:`score_batch`, whose outcome rewards (Eq. 6, or another form of OUTCOME_REWARDS) and step
rewards (Eq. 5 over a step-reward source's scores) the advantages are computed from.

Neither reads TRL's decoded completions, which lose the special-token tags. A source whose
``final`` attribute is true returns step rewards already (no Eq. 5), ``NaN`` meaning "no step reward".
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prorag.agent.trajectory import Trajectory
from prorag.core.metrics import exact_match, f1_score
from prorag.data.records import Record
from prorag.method.rewards.outcome import (
    OUTCOME_REWARDS,
    OutcomeReward,
    OutcomeRewardConfig,
    RewardInputs,
    trajectory_answer,
    trajectory_format_valid,
)
from prorag.method.rewards.process import trajectory_step_rewards
from prorag.method.rewards.sources import StepRewardSource
from prorag.stages.rl.config import RLConfig


def outcome_reward_function(
    prompts: list[Any],
    completions: list[Any],
    *,
    trajectory: list[Trajectory],
    golden_answers: list[list[str]],
    tokenizer: Any,
    config: OutcomeRewardConfig,
    **_: Any,
) -> list[float]:
    """TRL reward function: the configured outcome reward (``config.form`` in OUTCOME_REWARDS) of each
    row's :class:`~prorag.agent.trajectory.Trajectory` (TRL's ``completions`` are ignored: they are decoded
    without the special tokens, i.e. the tags). Logged only: without records and policy, ``hiprag``
    here judges no step; the advantages use :func:`score_batch`'s full reward."""
    return OUTCOME_REWARDS.get(config.form)(config)(RewardInputs(trajectory, golden_answers, tokenizer))


def outcome(**kwargs: Any) -> list[float]:
    """The outcome reward, under the name TRL logs it by (``rewards/outcome/mean``)."""
    return outcome_reward_function(**kwargs)


@dataclass
class ScoredBatch:
    """What one generation batch (this process's rows) scored: per-row outcome rewards, step
    rewards (one per action, empty without a PRM) and the statistics logged per step."""

    outcome: list[float]
    step_rewards: list[list[float]]
    f1: list[float]
    em: list[float]
    format_valid: list[float]
    searches: list[float]
    prm_seconds: float = 0.0
    ratios: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Further per-step metrics as (numerator, denominator) sums over this process's rows, summed
    over processes before dividing: the outcome reward's own (``last_ratios``, e.g. HiPRAG's
    over/under-search rates) and ``process_steps_per_trajectory`` (actions with a finite step
    reward: 0 says the logged ``process_reward`` mean had no step, e.g. cpsearch without retrievals)."""


def score_batch(
    trajectories: Sequence[Trajectory],
    golds: Sequence[Sequence[str]],
    tokenizer: Any,
    config: RLConfig,
    scorer: StepRewardSource | None,
    records: Sequence[Record] | None = None,
    group_ids: Sequence[int] | None = None,
    policy: Any = None,
    retriever: Any = None,
    outcome_fn: OutcomeReward | None = None,
    step: int | None = None,
) -> ScoredBatch:
    """Rewards and statistics of rolled-out trajectories: Eq. 6 per trajectory, Eq. 5 per action
    (the step-reward source, e.g. the PRM, scores every action of every trajectory in one batched
    call; skipped without a source), answer F1/EM and I_traj as the outcome reward reads them,
    searches per trajectory. ``records`` and ``group_ids`` (one per trajectory) go to the source;
    ``records``, ``policy`` (unwrapped, for HiPRAG's re-ask) and ``retriever`` (P2S's
    gold-conditioned samples search like the rollouts) to the outcome reward ``outcome_fn`` (the
    trainer builds it once, so a judge's cache and a reward's counters live across batches; else
    ``config.outcome_reward.form`` in OUTCOME_REWARDS is built for this call), with the run's seed
    and the trainer's ``step`` (P2S's candidates draw from streams named by them)."""
    answers = [trajectory_answer(t, tokenizer) for t in trajectories]
    f1 = [f1_score(a, list(g)) if a is not None else 0.0 for a, g in zip(answers, golds, strict=True)]
    em = [exact_match(a, list(g)) if a is not None else 0.0 for a, g in zip(answers, golds, strict=True)]
    valid = [float(trajectory_format_valid(t, tokenizer, strict=config.outcome_reward.strict)) for t in trajectories]
    if outcome_fn is None:
        outcome_fn = OUTCOME_REWARDS.get(config.outcome_reward.form)(config.outcome_reward)
    rewards = outcome_fn(
        RewardInputs(list(trajectories), golds, tokenizer, records, policy, retriever, seed=config.seed, step=step)
    )
    steps: list[list[float]] = [[] for _ in trajectories]
    seconds = 0.0
    if scorer is not None:
        start = time.perf_counter()
        logits = scorer(list(trajectories), records, **({"group_ids": list(group_ids)} if group_ids is not None else {}))
        final = getattr(scorer, "final", False)  # e.g. cpsearch: step rewards already, NaN = none
        steps = (
            [list(map(float, r)) for r in logits]
            if final
            else trajectory_step_rewards(list(trajectories), logits, config.step_reward)
        )
        seconds = time.perf_counter() - start
    ratios = dict(getattr(outcome_fn, "last_ratios", {}))
    if scorer is not None:
        ratios["process_steps_per_trajectory"] = (
            float(sum(math.isfinite(r) for rs in steps for r in rs)),
            float(len(trajectories)),
        )
    return ScoredBatch(rewards, steps, f1, em, valid, [float(t.num_searches) for t in trajectories], seconds, ratios)


__all__ = [
    "ScoredBatch",
    "outcome",
    "outcome_reward_function",
    "score_batch",
]
