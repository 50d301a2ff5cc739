"""A checkpoint whose weights (or pickled states) were cut short is skipped, with a warning naming
it and why, for the next older complete one, instead of wedging every resume (issue 70)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from prorag.stages.training import inspect_checkpoint, last_complete_checkpoint, resume_training


def checkpoint(root: Path, step: int) -> Path:
    """A complete Trainer checkpoint folder in miniature: weights, optimiser state, trainer state last."""
    folder = root / "checkpoints" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    save_file({"w": torch.full((64,), float(step)), "b": torch.zeros(3)}, str(folder / "model.safetensors"))
    torch.save({"state": {0: torch.ones(64)}}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_a_checkpoint_with_a_cut_file_is_skipped_for_the_older_one(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    older, newer = checkpoint(tmp_path, 1), checkpoint(tmp_path, 2)
    assert inspect_checkpoint(newer) == (2, None)
    cut_in_half(newer / name)
    step, problem = inspect_checkpoint(newer)
    assert step is None and problem is not None and problem.startswith(f"damaged {name}: ")
    with caplog.at_level(logging.WARNING, logger="prorag.stages.training"):
        assert last_complete_checkpoint(tmp_path / "checkpoints") == (older, 1)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"skipping checkpoint {newer}: damaged {name}: ")
    assert (newer / name).exists()  # left for the Trainer to write again


class RecordingTrainer:
    """What :func:`resume_training` asks of a Trainer, recording where it resumed from."""

    def __init__(self) -> None:
        self.args = SimpleNamespace(max_steps=10)
        self.resumed_from: Any = "never trained"

    def is_world_process_zero(self) -> bool:
        return True

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        self.resumed_from = resume_from_checkpoint


def test_resume_continues_from_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    older = checkpoint(tmp_path, 1)
    cut_in_half(checkpoint(tmp_path, 2) / "model.safetensors")
    trainer = RecordingTrainer()
    resume_training(trainer, tmp_path, "SFT")
    assert trainer.resumed_from == str(older)
    cut_in_half(older / "model.safetensors")
    resume_training(trainer, tmp_path, "SFT")
    assert trainer.resumed_from is None  # nothing left to resume: a fresh start
