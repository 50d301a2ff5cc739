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
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from prorag.core.kernels import compile_norms as compile_model_norms
from prorag.core.kernels import training_attention
from prorag.data.jsonl import JsonlAppender, read_jsonl, write_jsonl
from prorag.data.safetensors_files import folder_damage
from prorag.stages.training_config import LoRAConfig, TrainingConfig, use_bf16  # noqa: F401  (re-exported: moved there)

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


def time_budget(config: TrainingConfig) -> list[TrainerCallback]:
    """The :class:`TimeBudget` callback when ``config.max_minutes`` is set, else nothing."""
    return [TimeBudget(config.max_minutes)] if config.max_minutes is not None else []


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
