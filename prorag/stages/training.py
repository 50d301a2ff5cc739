"""Plumbing shared by the stages' trainers (SFT, PRM, RFT, RL): the metrics log, the time
budget, the bf16 switch, resuming from the last checkpoint and writing the trained policy.

Every stage trains through a Hugging Face/TRL ``Trainer`` in a run folder laid out the same
way (``checkpoints/``, ``metrics.jsonl``, the result folder); these helpers are what makes
that layout the same.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from prorag.data.jsonl import JsonlAppender

log = logging.getLogger(__name__)


class MetricsFile(TrainerCallback):
    """Appends every log of the trainer to ``metrics.jsonl`` (with ``step`` and ``epoch``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        with JsonlAppender(self.path) as out:
            out.append({"step": state.global_step, "epoch": state.epoch, **logs})


class TimeBudget(TrainerCallback):
    """Stops training (with a checkpoint) once ``minutes`` of training have passed."""

    def __init__(self, minutes: float) -> None:
        self.seconds = 60.0 * minutes
        self.start = time.monotonic()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if time.monotonic() - self.start >= self.seconds:
            log.info("time budget of %.1f min spent at step %d: stopping", self.seconds / 60, state.global_step)
            control.should_training_stop = True
            control.should_save = True


def trainer_arguments(config: Any, run_dir: str | Path) -> dict[str, Any]:
    """The ``TrainingArguments`` every stage sets the same way, from the stage config's shared
    fields (``epochs``, ``max_steps``, batch size and accumulation, the optimiser and schedule,
    ``gradient_checkpointing``, ``bf16``, ``seed``, checkpoint and logging intervals,
    ``report_to``): checkpoints in ``run_dir/checkpoints``, the CPU used when there is no CUDA
    device, one seed for the model and the data order. A stage adds its own arguments."""
    cuda = torch.cuda.is_available()
    return dict(
        output_dir=str(Path(run_dir) / "checkpoints"),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.per_device_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        activation_checkpointing=config.gradient_checkpointing,  # transformers 5's name of gradient checkpointing
        bf16=use_bf16(config.bf16),
        fp16=False,
        use_cpu=not cuda,
        dataloader_pin_memory=cuda,
        seed=config.seed,
        data_seed=config.seed,
        save_strategy="steps",
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        logging_steps=config.logging_steps,
        logging_first_step=True,
        report_to=config.report_to,
    )


def use_bf16(setting: bool | str) -> bool:
    """``"auto"``: bf16 when a CUDA device supports it; otherwise the setting itself."""
    if setting == "auto":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bool(setting)


def resume_training(trainer: Any, run_dir: Path, what: str) -> None:
    """Train, continuing from the last checkpoint in ``run_dir/checkpoints`` if there is one
    (global step, optimiser, scheduler and data order continue)."""
    from transformers.trainer_utils import get_last_checkpoint

    ckpt_dir = run_dir / "checkpoints"
    last = get_last_checkpoint(str(ckpt_dir)) if ckpt_dir.is_dir() else None
    if last:
        log.info("resuming %s from %s", what, last)
    trainer.train(resume_from_checkpoint=last)


def save_trained_policy(trainer: Any, tokenizer: Any, out: Path, *, merge_lora: bool) -> Any | None:
    """Write the trained policy to ``out`` (LoRA merged, generation settings for the tags) from
    the main process; return it there, ``None`` on the other processes."""
    from prorag.models.checkpoints import save_policy
    from prorag.models.tags import configure_generation

    trainer.accelerator.wait_for_everyone()
    if not trainer.is_world_process_zero():
        return None
    policy = trainer.accelerator.unwrap_model(trainer.model)
    if merge_lora:
        policy = policy.merge_and_unload()
    configure_generation(policy, tokenizer)
    save_policy(policy, tokenizer, out)
    return policy
