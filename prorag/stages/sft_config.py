"""Stage 1's settings: :class:`SFTTrainingConfig` (the format-aware fine-tuning, Eq. 1; shared with
the stages that fine-tune on trajectories) and :class:`SFTConfig` (that, plus the model, the data
and the held-out rollouts), apart from the trainer so that a config or ``--help`` can name them
without importing torch or TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from prorag.agent.prompts import PromptStyle
from prorag.core.config import setting
from prorag.method.losses import DEFAULT_CONTROL_LAMBDA, REDUCTIONS, WEIGHT_SCHEMES, Reduction, WeightScheme
from prorag.stages.training_config import LoRAConfig, TrainingConfig

#: Values of ``SFTConfig.model`` that build a randomly initialised model (:func:`~prorag.models.tiny.make_tiny_model`).
BUILTIN_MODELS = ("tiny", "small")


@dataclass
class SFTTrainingConfig(TrainingConfig):
    """What the format-aware fine-tuning uses, in SFT and in RFT's second half: the shared
    training settings (defaults: the paper's and its reference code's, full fine-tuning, 1 epoch,
    lr 2e-5), the loss weights, the example length, LoRA and the trainer's own options."""

    # --- examples
    max_length: int = setting(
        2048, help="Longest example in tokens (prompt + completion); longer ones are dropped or cut on the right (`overlong`)."
    )
    overlong: Literal["drop", "truncate"] = setting(
        "drop", help="`drop` an overlong example, or `truncate` it on the right (the prompt is never cut)."
    )

    # --- loss
    weight_scheme: WeightScheme = setting(
        "reference", help='`"reference"`: the reference code\'s per-tag weights; `"paper"`: Eq. 1, `control_lambda` on every tag.'
    )
    control_lambda: float = setting(
        DEFAULT_CONTROL_LAMBDA, help='Eq. 1\'s lambda (> 1) for `weight_scheme="paper"`; the paper gives no value.'
    )
    tag_weights: dict[str, float] = setting(
        factory=dict, help='Per-tag overrides of the scheme\'s weights, e.g. `{"</step>": 3.0}`.'
    )
    reduction: Reduction = setting(
        "weighted_mean", help='`"weighted_mean"` (reference code) or `"sum"` (Eq. 1, divided by the number of target tokens).'
    )

    # --- trainer
    lora: LoRAConfig = setting(
        factory=LoRAConfig,
        help="A LoRA adapter instead of full fine-tuning; the rows of the ten tags in the input embedding are trained too.",
    )
    group_by_length: bool = setting(False, help="Batch examples of similar length together (less padding, faster on CPU).")
    fused_lm_head: bool | Literal["auto"] = setting(
        "auto", help='Compute the loss through TRL\'s fused LM head, without the full logits; `"auto"`: on CUDA.'
    )
    dataloader_num_workers: int = setting(0, help="Worker processes of the data loader (0: the main process).")

    def __post_init__(self) -> None:
        super().__post_init__()
        choices = {"weight_scheme": WEIGHT_SCHEMES, "reduction": REDUCTIONS, "overlong": ("drop", "truncate")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{type(self).__name__}.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.weight_scheme == "paper" and not self.control_lambda > 1:
            raise ValueError(f"{type(self).__name__}.control_lambda must be > 1 (Eq. 1), got {self.control_lambda}")

    def evaluation_arguments(self, has_eval: bool) -> dict[str, Any]:
        """The trainer's held-out evaluation keywords: none here (RFT has no held-out set)."""
        return {"eval_strategy": "no", "eval_steps": None}


@dataclass
class SFTConfig(SFTTrainingConfig):
    """Settings of the SFT stage: the fine-tuning (:class:`SFTTrainingConfig`), the model, the
    data and the held-out checks."""

    # --- model
    model: str = setting(
        "tiny", help='A local checkpoint folder or hub id, or `"tiny"` / `"small"` for a randomly initialised built-in model.'
    )
    tokenizer: str | None = setting(
        None, help="Tokenizer folder for a built-in model; `train_sft`'s `tokenizer` argument takes precedence."
    )
    world_dir: str | None = setting(
        None, help="A built-in world folder whose texts train the tokenizer of a built-in model that has none (deterministic)."
    )
    arch: Literal["llama", "qwen3"] = setting("llama", help="Architecture of a built-in model.")

    # --- what the model learns to write
    target: Literal["prorag", "naive", "standard-rag"] = setting(
        "prorag",
        help='`"prorag"`: the gold ProRAG trajectories; `"naive"` / `"standard-rag"`: the same questions as a '
        "one-shot baseline's examples (evaluate it with `prorag eval --baseline`).",
    )

    # --- data
    train_file: str | None = setting(
        None,
        help="JSONL of gold trajectories or of records (rendered with the retriever of `index`); `train_sft`'s "
        "`trajectories` argument replaces it.",
    )
    index: str | None = setting(
        None, help="Retrieval index folder or `http(s)://` URL: renders record files and runs the held-out rollouts."
    )
    top_k: int = setting(3, help="Documents per retrieval (rendering and held-out rollouts).")
    records_file: str | None = setting(
        None,
        help="Record file of the training questions when `train_file` holds trajectories: the held-out rollouts' "
        "retrieval partitions and gold answers.",
    )
    eval_file: str | None = setting(
        None, help="Held-out file (same kinds as `train_file`); unset: `eval_fraction` of the training trajectories."
    )
    eval_fraction: float = setting(
        0.05, help="Share of the training trajectories held out (seeded) when there is no `eval_file`."
    )
    missing_gold: Literal["keep", "drop"] = setting(
        "keep", help="Keep or drop a trajectory in which the retriever missed a hop's gold page."
    )
    prompt_style: PromptStyle | None = setting(
        None, help="`plain` or `chat`; default: chat when the tokenizer has a chat template (as the rollout engine)."
    )

    # --- held-out checks
    eval_steps: int | None = setting(
        None, help="Held-out loss every this many steps (default: `save_steps`); always once at the end."
    )
    eval_samples: int = setting(64, help="Held-out questions rolled out (greedy) at the end for the format-valid rate; 0 skips.")
    eval_batch_size: int = setting(32, help="Batch size of the held-out loss and of the rollouts.")

    def __post_init__(self) -> None:
        super().__post_init__()
        choices = {"missing_gold": ("keep", "drop"), "arch": ("llama", "qwen3"), "target": ("prorag", "naive", "standard-rag")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"SFTConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not 0 <= self.eval_fraction < 1:
            raise ValueError(f"SFTConfig.eval_fraction must be in [0, 1), got {self.eval_fraction}")

    def evaluation_arguments(self, has_eval: bool) -> dict[str, Any]:
        """Held-out loss every ``eval_steps`` (default ``save_steps``) when there is a held-out set."""
        return {
            "per_device_eval_batch_size": self.eval_batch_size,
            "eval_strategy": "steps" if has_eval else "no",
            "eval_steps": (self.eval_steps or self.save_steps) if has_eval else None,
        }
