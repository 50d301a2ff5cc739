"""Plumbing shared by the stages' trainers (SFT, PRM, RFT, RL): the metrics log, the time
budget, the bf16 switch, resuming from the last checkpoint and writing the trained policy.

Every stage trains through a Hugging Face/TRL ``Trainer`` in a run folder laid out the same
way (``checkpoints/``, ``metrics.jsonl``, the result folder); these helpers are what makes
that layout the same.
"""

from __future__ import annotations

import json
import logging
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from transformers import TrainerCallback

from prorag.core.config import setting
from prorag.core.kernels import compile_norms as compile_model_norms
from prorag.core.kernels import training_attention
from prorag.core.setting_checks import check_learning_rate
from prorag.data.jsonl import JsonlAppender, read_jsonl, write_jsonl
from prorag.data.safetensors_files import folder_damage

log = logging.getLogger(__name__)


class TrainerKernels:
    """A mixin for the stages' ``Trainer`` classes (listed before the Trainer base) that chooses
    the kernels of their forwards (:mod:`prorag.core.kernels`): each training and evaluation step
    runs with the attention kernels of :func:`~prorag.core.kernels.training_attention`
    (``cudnn_attention``), and with ``compile_norms`` the model's RMSNorm modules are compiled
    (:func:`~prorag.core.kernels.compile_norms`). Both are constructor keywords, from the stage's
    ``TrainingConfig`` (:meth:`TrainingConfig.kernel_settings`)."""

    def __init__(self, *args: Any, cudnn_attention: bool = False, compile_norms: bool = False, **kwargs: Any) -> None:
        self.cudnn_attention = cudnn_attention
        super().__init__(*args, **kwargs)
        if compile_norms:
            compile_model_norms(self.model)  # type: ignore[attr-defined]

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with training_attention(self.cudnn_attention):
            return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        with training_attention(self.cudnn_attention):
            return super().prediction_step(*args, **kwargs)  # type: ignore[misc]


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

    def time_budget(self) -> list[TrainerCallback]:
        """The :class:`TimeBudget` callback when ``max_minutes`` is set, else nothing."""
        return [TimeBudget(self.max_minutes)] if self.max_minutes is not None else []


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


#: A Trainer checkpoint folder's name; its number is the global step.
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: Weights a complete checkpoint holds one of (full model or LoRA adapter; sharded or not).
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


def checkpoint_step(folder: Path) -> int | None:
    """The global step of a *complete* checkpoint folder, None for an incomplete or damaged one
    (:func:`inspect_checkpoint`)."""
    return inspect_checkpoint(folder)[0]


def inspect_checkpoint(folder: Path) -> tuple[int | None, str | None]:
    """A checkpoint folder's global step and ``None``, or ``None`` and why it cannot be resumed from.

    The Trainer writes ``trainer_state.json`` last (after the weights, optimiser, scheduler and
    RNG states), so a checkpoint killed mid-write lacks it or holds it truncated. A folder damaged
    later (a full disk, a copy cut short) can hold a sound trainer state beside cut weights, so
    the weights' headers are read too (their layout must reach the end of each file:
    :func:`~prorag.data.safetensors_files.folder_damage`), and the pickled states (zip archives)
    must end in their zip directory, which a cut file lacks. Nothing else is read: choosing costs
    milliseconds whatever the model's size.
    """
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
    except OSError:
        return None, "no trainer_state.json (killed while it was written?)"
    except ValueError:
        return None, "trainer_state.json is cut short (killed while it was written?)"
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int):
        return None, "trainer_state.json names no global_step"
    if not any((folder / w).is_file() for w in _WEIGHTS):
        return None, "no weights file (killed while it was written?)"
    damaged = folder_damage(folder) or _damaged_archive(folder)
    if damaged is not None:
        return None, f"damaged {damaged}"
    return step, None


def _damaged_archive(folder: Path) -> str | None:
    """The first of ``folder``'s torch-saved states (``*.pt``, ``*.pth``: zip archives) that is
    cut short, with why; files in torch's older non-zip format are not checked."""
    for path in sorted([*folder.glob("*.pt"), *folder.glob("*.pth")]):
        try:
            with path.open("rb") as f:
                if f.read(4) != b"PK\x03\x04":
                    continue
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (OSError, zipfile.BadZipFile) as e:
            return f"{path.name}: {e}"
    return None


def last_complete_checkpoint(ckpt_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint in ``ckpt_dir`` and its step; newer incomplete or damaged
    ones (:func:`inspect_checkpoint`) are skipped with a warning naming the folder and why, and
    left on disk (the Trainer rewrites that folder when it reaches the step again)."""
    if not ckpt_dir.is_dir():
        return None
    numbered = [(int(m.group(1)), d) for d in ckpt_dir.iterdir() if d.is_dir() and (m := _CHECKPOINT.match(d.name))]
    for _, folder in sorted(numbered, reverse=True):
        step, problem = inspect_checkpoint(folder)
        if step is not None:
            return folder, step
        log.warning("skipping checkpoint %s: %s; trying the next older one", folder, problem)
    return None


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of ``metrics.jsonl`` logged after ``step`` (the step training resumes from; 0
    for a fresh start), rewriting the file atomically; return how many were dropped. Training
    logs those steps again, so without this a step would appear twice."""
    if not path.is_file():
        return 0
    rows = list(read_jsonl(path, tolerate_truncated_tail=True))
    kept = [r for r in rows if step and isinstance(r.get("step"), int) and r["step"] <= step]
    if len(kept) != len(rows):
        write_jsonl(path, kept)
    return len(rows) - len(kept)


def resume_training(trainer: Any, run_dir: Path, what: str) -> None:
    """Train, continuing from the newest complete checkpoint in ``run_dir/checkpoints`` if there is
    one (global step, optimiser, scheduler and data order continue); ``metrics.jsonl`` loses the
    rows after that step, which training logs again. A checkpoint at ``max_steps`` already is
    loaded (weights and state) without training."""
    found = last_complete_checkpoint(run_dir / "checkpoints")
    last, step = (str(found[0]), found[1]) if found else (None, 0)
    if trainer.is_world_process_zero():
        dropped = truncate_metrics(run_dir / "metrics.jsonl", step)
        if dropped:
            log.info("dropped %d metrics rows logged after step %d", dropped, step)
    sharded = getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False)
    if last and 0 < trainer.args.max_steps <= step and not sharded:
        # A run resumed at its last step in the middle of an epoch would train one step more: the
        # Trainer checks max_steps only after a step. Load the finished state instead (sharded
        # weights are the Trainer's own business to load: there it still trains that step).
        from transformers import TrainerState

        trainer._load_from_checkpoint(last)
        trainer.state = TrainerState.load_from_json(str(Path(last) / "trainer_state.json"))
        log.info("%s already finished at step %d (%s): nothing to train", what, step, last)
        return
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
