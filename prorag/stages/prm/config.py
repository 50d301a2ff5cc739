"""The PRM stage's settings, :class:`PRMConfig`, checked when built.

The defaults reproduce the paper (three epochs from pi_sft, Eq. 4 alone, a scalar head on the
policy's backbone) and its reference code for what the paper leaves out. Two additions beyond the
paper are off by default and need the ``head`` kind: pointwise labels (``pointwise_weight``) and a
fresh built-in backbone of another size (``backbone_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prorag.core.config import setting
from prorag.models.tiny import TINY_SIZES
from prorag.stages.training_config import TrainingConfig
from prorag.supervision.reward_model import DEFAULT_MAX_LENGTH, PRM_KINDS


@dataclass
class PRMConfig(TrainingConfig):
    """Settings of the PRM stage. The paper gives the epochs (3, from the SFT checkpoint); the
    reference code gives the rest (lr 2e-5, batch 8 x 4 accumulation, 4096 tokens); else TRL's.
    ``learning_rate`` 2e-5 is for real pretrained models; a tiny built-in model needs a higher one.
    The shared training fields are :class:`~prorag.stages.training_config.TrainingConfig`'s.
    """

    # --- model and data
    init: str | None = setting(
        None,
        help="The policy the PRM starts from (`pi_sft`): a checkpoint folder, a training run folder (its "
        "`policy/`) or a hub id. `train_prm`'s `init` argument replaces it.",
    )
    pairs_file: str | None = setting(
        None, help="The step-pairs JSONL (`prorag pairs`); `train_prm`'s `pairs` argument replaces it."
    )
    max_length: int = setting(
        DEFAULT_MAX_LENGTH,
        help="Longest input (context + step) in tokens; longer ones are cut from the left. Capped by the model's "
        "`max_position_embeddings`.",
    )
    append_eos: bool = setting(
        False,
        help="Append EOS after the step and read the score there (the reference code); default: read it on the "
        "step's closing tag.",
    )
    held_out_fraction: float = setting(
        0.05,
        help="Fraction of the *questions* whose pairs are held out for the pairwise accuracy (at least one "
        "question when > 0; the reference code held out 2% of pairs at random).",
    )
    # With one, the model is scored on the validation pairs before training and every `eval_steps`, and the weights with the
    # best validation pairwise accuracy (then AUC) are the ones saved, the initial weights included (earliest on ties): a run
    # that only overfits keeps what it started from. The held-out pairs are never used to choose anything.
    validation_fraction: float = setting(
        0.0, help="Fraction of the *training* questions set aside as a validation set (0: none, the paper)."
    )

    # --- optimisation (the shared fields are TrainingConfig's; these defaults differ)
    epochs: float = setting(3.0, help="Paper: three epochs.")
    per_device_batch_size: int = setting(8, help="Pairs per device and micro-batch (each is two sequences).")
    gradient_accumulation_steps: int = setting(4, help="Micro-batches per optimiser step (the reference code's 4).")
    save_steps: int = setting(200, help="Checkpoint every this many optimiser steps.")
    # `False` trains only the scalar head on frozen features; the paper's "train the scalar regression head from the SFT
    # checkpoint" can be read either way.
    train_backbone: bool = setting(True, help="Fine-tune the whole model (default).")
    center_rewards_coefficient: float | None = setting(
        None, help="TRL's auxiliary `coef * mean(r^2)` that keeps rewards near 0 (off, as in the paper)."
    )

    # --- run
    eval_steps: int | None = setting(
        None, help="Held-out evaluation every this many steps (default: `save_steps`); always once at the end."
    )
    eval_batch_size: int = setting(16, help="Pairs per batch of the held-out and validation scoring.")
    if_no_pairs: Literal["error", "untrained"] = setting(
        "error",
        help="When the judge found no pair (a policy too weak for any valid sibling step, as in a quick demo): "
        '`"error"` stops; `"untrained"` logs a warning and saves the reward model as built from the policy (a'
        " random head: its scores carry no process signal), so a pipeline with small budgets goes on, as "
        "RFT's `if_nothing_kept: copy_policy` does.",
    )
    # `"likelihood"`: the policy's causal LM itself, scoring a step by `likelihood_beta` times its mean token log-probability
    # (SimPO's length-normalised implicit reward), trained with the same Eq. 4; its zero point is fitted on the training pairs
    # after training (separating_threshold). See prorag.supervision.reward_model for why it exists.
    kind: str = setting(
        "head",
        help="A name in PRM_KINDS. `head` (the paper): the policy's backbone with a new scalar head on the step's last token; `likelihood`: "
        "the policy's LM scoring a step by its mean token log-probability, trained with Eq. 4; `likelihood_ratio`: "
        "`likelihood_beta * (mean log p_phi - mean log p_init)`, the same against the frozen init policy (0 at the start).",
    )
    likelihood_beta: float = setting(
        1.0,
        help="The likelihood kind's scale: the logit of a step is `beta * (mean log p - offset)`, so the sigmoid "
        "of a pair's margin is `sigmoid(beta * difference in mean log-probability)`.",
    )
    # Costs one policy forward per held-out step; off for a policy too large to load beside the PRM.
    likelihood_baseline: bool = setting(
        True,
        help="Also rank the held-out pairs by the init policy's own mean log-probability of each step "
        "(policy_step_likelihoods) and log it as `eval_policy_likelihood_accuracy` / `_auc`: the reference a "
        "trained PRM must beat to have learned more than the policy already prefers (MCTS siblings are policy"
        " samples, and invalid ones are often its unlikely draws).",
    )

    # --- beyond the paper
    pointwise_file: str | None = setting(
        None,
        help="Pointwise step labels (`prorag pairs` writes NAME.pointwise.jsonl beside NAME.jsonl); None: that file "
        "beside the pairs file when it exists.",
    )
    pointwise_weight: float | None = setting(
        None,
        help="Weight of the binary cross-entropy on the pointwise labels added to Eq. 4 (0: Eq. 4 alone, the paper). "
        "None: 1.0 for the `head` kind when pointwise labels exist, 0 for the likelihood kinds (which refuse > 0).",
    )
    backbone_size: str | None = setting(
        None,
        help="None: the PRM starts from the policy's own backbone (the paper); a TINY_SIZES name (`tiny`, `small`): "
        "a fresh built-in model of that size on the policy's tokenizer, drawn as SFT draws the policy (`head` kind only).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pointwise_weight is not None and not self.pointwise_weight >= 0:
            raise ValueError(f"PRMConfig.pointwise_weight must be >= 0, got {self.pointwise_weight}")
        if self.pointwise_weight and self.kind != "head":
            raise ValueError(
                f"PRMConfig.pointwise_weight > 0 needs kind 'head' (a calibrated scalar score); the {self.kind} kind's "
                "zero point is fitted after training, so a cross-entropy on its raw score would fight that fit"
            )
        if self.backbone_size is not None and self.backbone_size not in TINY_SIZES:
            raise ValueError(f"PRMConfig.backbone_size must be one of {sorted(TINY_SIZES)} or null, got {self.backbone_size!r}")
        if self.backbone_size is not None and self.kind != "head":
            raise ValueError(
                f"PRMConfig.backbone_size needs kind 'head': the {self.kind} kind scores by a language model's likelihood, "
                "and a fresh backbone's is noise"
            )
        if not 0 <= self.held_out_fraction < 1:
            raise ValueError(f"PRMConfig.held_out_fraction must be in [0, 1), got {self.held_out_fraction}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"PRMConfig.validation_fraction must be in [0, 1), got {self.validation_fraction}")
        if self.max_length < 2:
            raise ValueError(f"PRMConfig.max_length must be >= 2, got {self.max_length}")
        if self.eval_batch_size < 1:
            raise ValueError(f"PRMConfig.eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.bf16 not in (True, False, "auto"):
            raise ValueError(f"PRMConfig.bf16 must be true, false or 'auto', got {self.bf16!r}")
        PRM_KINDS.check(self.kind, "PRMConfig.kind")
        if not self.likelihood_beta > 0:
            raise ValueError(f"PRMConfig.likelihood_beta must be > 0, got {self.likelihood_beta}")
        try:
            PRM_KINDS.get(self.kind).check_settings(append_eos=self.append_eos, beta=self.likelihood_beta)
        except ValueError as err:
            raise ValueError(f"PRMConfig: {err}") from None
        if self.if_no_pairs not in ("error", "untrained"):
            raise ValueError(f"PRMConfig.if_no_pairs must be 'error' or 'untrained', got {self.if_no_pairs!r}")
