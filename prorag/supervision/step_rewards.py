"""The step-reward sources backed by the supervision layer: ``"prm"``, the learned PRM.

Imported by :data:`~prorag.method.rewards.sources.STEP_REWARD_SOURCES` on its first look-up, so
that ``RLConfig.process_reward: prm`` finds the factory below without the registry (method
layer) importing upwards.
"""

from __future__ import annotations

from typing import Any

from prorag.method.rewards.sources import STEP_REWARD_SOURCES, ScorerSteps


@STEP_REWARD_SOURCES.register("prm")
def prm_step_rewards(config: Any, *, device: str | None = None) -> ScorerSteps:
    """ProRAG's step scores: the frozen PRM saved at ``config.prm`` (either kind, read from its
    folder by :meth:`~prorag.supervision.reward_model.ProcessRewardModel.load`) on ``device``,
    scoring ``config.prm_batch_size`` inputs at a time."""
    from prorag.supervision.reward_model import ProcessRewardModel

    if not config.prm:
        raise ValueError("process_reward='prm' needs a PRM: pass `scorer` or set `prm` (or use process_reward='none')")
    return ScorerSteps(ProcessRewardModel.load(config.prm, device=device), config.prm_batch_size)


__all__ = ["prm_step_rewards"]
