"""The offline DPO baseline's settings (:class:`DPOConfig`: the MCTS step pairs, beta, the fine-tuning),
apart from the trainer so that a config or ``--help`` can name them without importing TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prorag.core.config import setting
from prorag.stages.training_config import LoRAConfig, TrainingConfig
from prorag.supervision.reward_model import DEFAULT_MAX_LENGTH


@dataclass
class DPOConfig(TrainingConfig):
    """Settings of the offline DPO baseline (``prorag dpo``). Neither ProRAG nor its seed papers give
    ReasonRAG's hyper-parameters, so these are TRL's DPO defaults (``beta`` 0.1, sigmoid loss); the
    shared training fields are :class:`~prorag.stages.training_config.TrainingConfig`'s. ``learning_rate``
    1e-6 is TRL's for real pretrained models; a tiny built-in model needs a far higher one."""

    init: str | None = setting(
        None,
        help="The policy DPO starts from and is regularised towards (`pi_sft`): a checkpoint folder, a training run "
        "folder (its `policy/`) or a hub id. `train_dpo`'s `init` argument replaces it.",
    )
    pairs_file: str | None = setting(
        None, help="The step-pairs JSONL (`prorag pairs`); `train_dpo`'s `pairs` argument replaces it."
    )
    beta: float = setting(0.1, help="DPO's beta: the strength of the pull towards the reference policy (TRL's default).")
    loss_type: str = setting("sigmoid", help='TRL\'s DPO loss ("sigmoid": the DPO paper\'s; "ipo", "hinge", ...).')
    max_length: int = setting(
        DEFAULT_MAX_LENGTH,
        help="Longest prompt + step in tokens; longer prompts lose their oldest tokens (the steps are kept whole). "
        "Capped by the model's `max_position_embeddings`.",
    )
    learning_rate: float = setting(1e-6, help="Peak learning rate of AdamW (TRL's DPO default).")
    lora: LoRAConfig = setting(
        factory=LoRAConfig, help="A LoRA adapter instead of full fine-tuning (the reference is then the adapter-free model)."
    )
    if_no_pairs: Literal["error", "copy_policy"] = setting(
        "error",
        help='When the pairs file holds no pair: `"error"` stops; `"copy_policy"` logs a warning and writes `init` '
        "unchanged as the DPO policy, so a pipeline with small budgets goes on.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.beta > 0:
            raise ValueError(f"DPOConfig.beta must be > 0, got {self.beta}")
        if self.max_length < 2:
            raise ValueError(f"DPOConfig.max_length must be >= 2, got {self.max_length}")
        if self.if_no_pairs not in ("error", "copy_policy"):
            raise ValueError(f"DPOConfig.if_no_pairs must be 'error' or 'copy_policy', got {self.if_no_pairs!r}")
