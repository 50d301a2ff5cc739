"""The training settings every training stage shares (:class:`TrainingConfig`: optimiser, schedule,
checkpoints, precision, kernels, time budget) and :class:`LoRAConfig`, apart from the training
helpers so that a config or ``--help`` can name them without importing torch or transformers.

A stage's config extends :class:`TrainingConfig` with its own fields; the checks (a finite,
positive learning rate, counts >= 1) run in ``__post_init__``, so YAML, ``--set`` and Python are
refused alike, before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from prorag.core.config import setting
from prorag.core.lazy_modules import lazy_module
from prorag.core.setting_checks import check_learning_rate

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch")


@dataclass
class TrainingConfig:
    """The optimisation and run settings every stage's trainer (SFT, PRM, RFT, RL) shares.

    A stage config inherits it and redeclares only the defaults that differ (TRL's
    ``base_config`` pattern), so these fields stay flat in YAML (``sft.learning_rate``).
    :meth:`training_arguments` turns them into ``TrainingArguments`` keywords.
    """

    dtype: str = setting("float32", help='Dtype the weights are loaded and trained in ("auto": the checkpoint\'s own).')
    epochs: float = setting(1.0, help="Passes over the training data.")
    max_steps: int = setting(-1, help="Optimiser steps; -1: train by `epochs` (a count >= 1 overrides them).")
    max_minutes: float | None = setting(
        None, help="Wall-clock budget of the training loop; training stops (and saves) once it is spent."
    )
    per_device_batch_size: int = setting(8, help="Examples per device and micro-batch.")
    gradient_accumulation_steps: int = setting(1, help="Micro-batches per optimiser step.")
    learning_rate: float = setting(2e-5, help="Peak learning rate of AdamW.")
    lr_scheduler_type: str = setting("linear", help="Transformers' learning-rate schedule name.")
    warmup_ratio: float = setting(0.03, help="Share of the total steps spent warming up the learning rate.")
    weight_decay: float = setting(0.0, help="AdamW weight decay.")
    max_grad_norm: float = setting(1.0, help="Gradient clipping norm.")
    gradient_checkpointing: bool = setting(False, help="Recompute activations in the backward pass (pays only for large models).")
    cudnn_attention: bool = setting(
        False,
        help="Let PyTorch pick cuDNN's attention kernel for the trainer's forwards (Hopper GPUs). Off: flash, "
        "memory-efficient or math kernels; cuDNN's sets up every new input shape on the host, and padded batches "
        "change shape at every step.",
    )
    compile_norms: bool = setting(
        False,
        help="Compile the model's RMSNorm modules (torch.compile, dynamic shapes): one fused kernel per norm instead of "
        "about seven, in training and in the rollouts of the same model. The first forward pays the compilation.",
    )
    bf16: bool | Literal["auto"] = setting(
        "auto", help='bf16 mixed precision; "auto": when a CUDA device supports it (never on CPU).'
    )
    seed: int = setting(0, help="Seed of the model initialisation and the data order.")
    save_steps: int = setting(500, help="Checkpoint every this many optimiser steps.")
    save_total_limit: int | None = setting(2, help="Checkpoints kept (None: all).")
    logging_steps: int = setting(10, help="Log the metrics every this many steps.")
    report_to: str | list[str] = setting("none", help='Trainer\'s report_to ("none", "wandb", ...).')

    #: What a ``learning_rate`` of 0 means in this stage, or ``None``: then it is refused, as a
    #: run that trains nothing while it looks like training (RL's frozen control names its use).
    ZERO_LEARNING_RATE: ClassVar[str | None] = None

    def kernel_settings(self) -> dict[str, bool]:
        """The :class:`TrainerKernels` keywords of a stage's trainer (``cudnn_attention``, ``compile_norms``)."""
        return {"cudnn_attention": self.cudnn_attention, "compile_norms": self.compile_norms}

    def __post_init__(self) -> None:
        """Refuse step counts the Trainer would misread: ``max_steps`` 0 trains one step and any
        negative value trains by epochs, so only -1 (epochs) or a positive count is accepted. And a
        learning rate that is not finite and > 0 (:attr:`ZERO_LEARNING_RATE`), which torch would
        refuse only after the model loaded and the run folder was written."""
        name = type(self).__name__
        if self.max_steps != -1 and self.max_steps < 1:
            raise ValueError(f"{name}.max_steps must be -1 (train by epochs) or >= 1, got {self.max_steps}")
        for field in ("per_device_batch_size", "gradient_accumulation_steps", "save_steps", "logging_steps"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be >= 1, got {getattr(self, field)}")
        if not self.epochs > 0:
            raise ValueError(f"{name}.epochs must be > 0, got {self.epochs}")
        check_learning_rate(self.learning_rate, f"{name}.learning_rate", zero_means=self.ZERO_LEARNING_RATE)

    def training_arguments(self, run_dir: str | Path) -> dict[str, Any]:
        """The ``TrainingArguments`` keywords every stage sets the same way: checkpoints in
        ``run_dir/checkpoints``, the CPU used when there is no CUDA device, one seed for the model
        and the data order. A stage adds its own arguments."""
        cuda = torch.cuda.is_available()
        return dict(
            output_dir=str(Path(run_dir) / "checkpoints"),
            num_train_epochs=self.epochs,
            max_steps=self.max_steps,
            per_device_train_batch_size=self.per_device_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            learning_rate=self.learning_rate,
            lr_scheduler_type=self.lr_scheduler_type,
            warmup_steps=self.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
            weight_decay=self.weight_decay,
            max_grad_norm=self.max_grad_norm,
            activation_checkpointing=self.gradient_checkpointing,  # transformers 5's name of gradient checkpointing
            bf16=use_bf16(self.bf16),
            fp16=False,
            use_cpu=not cuda,
            dataloader_pin_memory=cuda,
            seed=self.seed,
            data_seed=self.seed,
            save_strategy="steps",
            save_steps=self.save_steps,
            save_total_limit=self.save_total_limit,
            logging_steps=self.logging_steps,
            logging_first_step=True,
            report_to=self.report_to,
        )


@dataclass
class LoRAConfig:
    """A LoRA adapter instead of full fine-tuning (merged into the saved policy); YAML
    ``lora: {enabled: true, r: 16}``."""

    enabled: bool = setting(False, help="Train a LoRA adapter instead of every weight.")
    r: int = setting(16, help="Rank of the adapter.")
    alpha: int = setting(32, help="LoRA alpha (the update is scaled by alpha / r).")
    dropout: float = setting(0.05, help="Dropout on the adapter's input.")
    target_modules: str | list[str] = setting(
        "all-linear", help='Modules given an adapter (peft\'s "all-linear": every linear layer but the head).'
    )

    def peft_config(self, **extra: Any) -> Any:
        """peft's ``LoraConfig`` for a causal LM (``extra``: e.g. ``trainable_token_indices``), or
        ``None`` when LoRA is off."""
        if not self.enabled:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type="CAUSAL_LM",
            **extra,
        )


def use_bf16(setting: bool | str) -> bool:
    """``"auto"``: bf16 when a CUDA device supports it; otherwise the setting itself."""
    if setting == "auto":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(setting)
