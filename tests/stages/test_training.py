"""The shared training settings: TrainingConfig's TrainingArguments, LoRAConfig's peft config."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from prorag.data.jsonl import read_jsonl
from prorag.stages.prm import PRMConfig
from prorag.stages.rl import RLConfig
from prorag.stages.sft_config import SFTConfig
from prorag.stages.training import TimeBudget, TrainerKernels, last_complete_checkpoint, time_budget, truncate_metrics
from prorag.stages.training_config import LoRAConfig, TrainingConfig


def test_training_arguments_map_the_fields_as_before(tmp_path: Path) -> None:
    """Hand-checked: every shared field lands on its TrainingArguments name (``warmup_ratio`` on
    ``warmup_steps``, ``gradient_checkpointing`` on ``activation_checkpointing``, one seed twice)."""
    cfg = TrainingConfig(
        epochs=2.0, max_steps=7, per_device_batch_size=3, gradient_accumulation_steps=4, learning_rate=1e-4,
        lr_scheduler_type="cosine", warmup_ratio=0.1, weight_decay=0.01, max_grad_norm=0.5, gradient_checkpointing=True,
        bf16=False, seed=5, save_steps=9, save_total_limit=None, logging_steps=2, report_to=["tensorboard"],
    )  # fmt: skip
    cuda = torch.cuda.is_available()
    assert cfg.training_arguments(tmp_path) == {
        "output_dir": str(tmp_path / "checkpoints"),
        "num_train_epochs": 2.0,
        "max_steps": 7,
        "per_device_train_batch_size": 3,
        "gradient_accumulation_steps": 4,
        "learning_rate": 1e-4,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.1,
        "weight_decay": 0.01,
        "max_grad_norm": 0.5,
        "activation_checkpointing": True,
        "bf16": False,
        "fp16": False,
        "use_cpu": not cuda,
        "dataloader_pin_memory": cuda,
        "seed": 5,
        "data_seed": 5,
        "save_strategy": "steps",
        "save_steps": 9,
        "save_total_limit": None,
        "logging_steps": 2,
        "logging_first_step": True,
        "report_to": ["tensorboard"],
    }
    assert time_budget(TrainingConfig()) == []
    assert isinstance(time_budget(TrainingConfig(max_minutes=1.0))[0], TimeBudget)


def test_stage_defaults_are_unchanged() -> None:
    """Each stage keeps the defaults it had before the shared base class."""
    sft, prm, rl = SFTConfig(), PRMConfig(), RLConfig()
    assert (sft.learning_rate, sft.warmup_ratio, sft.save_steps, sft.logging_steps, sft.epochs) == (2e-5, 0.03, 500, 10, 1.0)
    assert (prm.epochs, prm.gradient_accumulation_steps, prm.save_steps, prm.learning_rate, prm.logging_steps) == (
        3.0,
        4,
        200,
        2e-5,
        10,
    )
    assert (rl.learning_rate, rl.lr_scheduler_type, rl.warmup_ratio, rl.save_steps, rl.logging_steps) == (
        1e-5,
        "constant",
        0.0,
        50,
        1,
    )
    assert (rl.rollout.max_actions, rl.rollout.batch_size, rl.rollout.temperature, rl.group_size) == (11, 64, 1.0, 8)
    for cfg in (sft, prm, rl):
        assert (cfg.dtype, cfg.bf16, cfg.seed, cfg.save_total_limit, cfg.report_to, cfg.max_steps) == (
            "float32",
            "auto",
            0,
            2,
            "none",
            -1,
        )
    assert (sft.lora, rl.lora) == (LoRAConfig(), LoRAConfig())
    assert (LoRAConfig().r, LoRAConfig().alpha, LoRAConfig().dropout, LoRAConfig().target_modules) == (16, 32, 0.05, "all-linear")


def test_lora_peft_config() -> None:
    assert LoRAConfig().peft_config() is None
    peft = LoRAConfig(enabled=True, r=8, alpha=16, dropout=0.1, target_modules=["q_proj"]).peft_config()
    assert (peft.r, peft.lora_alpha, peft.lora_dropout, set(peft.target_modules), peft.task_type) == (
        8,
        16,
        0.1,
        {"q_proj"},
        "CAUSAL_LM",
    )


def _checkpoint(root: Path, step: int, *files: str) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in files:
        if name.endswith(".safetensors"):  # sound weights: a checkpoint's weights headers are read
            save_file({"w": torch.zeros(2)}, str(folder / name))
        else:
            (folder / name).write_text(json.dumps({"global_step": step}) if name == "trainer_state.json" else "{}")
    return folder


def test_the_newest_complete_checkpoint_is_picked(tmp_path: Path) -> None:
    assert last_complete_checkpoint(tmp_path / "none") is None
    done = _checkpoint(tmp_path, 9, "model.safetensors", "optimizer.pt", "trainer_state.json")
    _checkpoint(tmp_path, 10, "config.json", "generation_config.json")  # killed before the weights
    _checkpoint(tmp_path, 11, "adapter_model.safetensors", "optimizer.pt")  # killed before the trainer state
    truncated = _checkpoint(tmp_path, 12, "model.safetensors")
    (truncated / "trainer_state.json").write_text('{"global_st')
    _checkpoint(tmp_path, 2, "adapter_model.safetensors", "trainer_state.json")
    assert last_complete_checkpoint(tmp_path) == (done, 9)


def test_metrics_after_the_resumed_step_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert truncate_metrics(path, 3) == 0 and not path.exists()
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2, 3, 4, 5)) + '{"step": 6, "lo')
    assert truncate_metrics(path, 3) == 2  # steps 4 and 5 (the cut-off row is not a row)
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
    assert truncate_metrics(path, 3) == 0
    assert truncate_metrics(path, 0) == 3 and path.read_text() == ""  # a fresh start keeps nothing


class _RecordingTrainer:
    """A Trainer's two step methods, returning whether cuDNN's attention was allowed during them."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    def training_step(self, *_: object) -> bool:
        return torch.backends.cuda.cudnn_sdp_enabled()

    def prediction_step(self, *_: object) -> bool:
        return torch.backends.cuda.cudnn_sdp_enabled()


class _Trainer(TrainerKernels, _RecordingTrainer):
    pass


def test_the_stages_trainers_step_without_cudnn_attention_unless_asked() -> None:
    """``cudnn_attention`` (TrainingConfig, default off) chooses the attention kernels of every
    training and evaluation step; the keyword goes no further than the mixin."""
    from prorag.stages.dpo import StepDPOTrainer
    from prorag.stages.prm import PairwiseRewardTrainer
    from prorag.stages.rl import ProcessSupervisedGRPOTrainer
    from prorag.stages.sft import WeightedSFTTrainer

    default = _Trainer(seed=1)
    assert default.kwargs == {"seed": 1} and default.cudnn_attention is False
    assert default.training_step() is False and default.prediction_step() is False
    asked = _Trainer(cudnn_attention=True)
    assert asked.kwargs == {} and asked.training_step() is True and asked.prediction_step() is True
    assert torch.backends.cuda.cudnn_sdp_enabled(), "the setting is as it was after each step"
    assert TrainingConfig().cudnn_attention is False
    for trainer in (WeightedSFTTrainer, PairwiseRewardTrainer, StepDPOTrainer, ProcessSupervisedGRPOTrainer):
        assert trainer.__mro__.index(TrainerKernels) == 1, trainer.__name__
