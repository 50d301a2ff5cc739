"""Fixtures of the models tests: a tiny built-in world and its world tokenizer (built once for all of them, as when they were one module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorag.data.world.generator import build_world
from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world")
    build_world(out, seed=0, size="tiny")
    return out


@pytest.fixture(scope="session")
def world_tok(world_dir: Path):
    return train_world_tokenizer(world_tokenizer_texts(world_dir))
