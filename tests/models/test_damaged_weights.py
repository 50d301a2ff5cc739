"""A policy folder or a trainable-state file whose weights were cut short is a ``DataError``
naming the file and what to do, before transformers or torch reads it (issue 70)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.core.errors import DataError
from prorag.models.checkpoints import load_policy, load_trainable_state, save_policy, save_trainable_state
from prorag.models.tiny import make_tiny_model


def cut_in_half(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def test_a_policy_with_truncated_weights_names_the_file(world_tok, tmp_path: Path) -> None:
    folder = save_policy(make_tiny_model(world_tok, seed=1), world_tok, tmp_path / "policy")
    weights = cut_in_half(folder / "model.safetensors")
    with pytest.raises(DataError) as e:
        load_policy(str(folder))
    message = str(e.value)
    assert message.startswith(f"{weights}: damaged safetensors file: the header needs ")
    assert message.endswith("restore the checkpoint, or train or export it again")
    with pytest.raises(DataError, match="damaged safetensors file"):
        load_policy(str(tmp_path))  # the run folder stands for its policy/


def test_a_truncated_trainable_state_names_the_file(world_tok, tmp_path: Path) -> None:
    model = make_tiny_model(world_tok, seed=1)
    path = cut_in_half(save_trainable_state(model, tmp_path / "best.safetensors"))
    with pytest.raises(DataError, match=f"^{path}: damaged safetensors file: .*; restore it, or rerun what wrote it$"):
        load_trainable_state(model, path)
