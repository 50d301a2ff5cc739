"""Shared test fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: The shared folder beside the repository (override with PRORAG_SHARED).
SHARED_DIR = Path(os.environ.get("PRORAG_SHARED", Path(__file__).resolve().parents[2] / "shared"))
#: The real benchmark files (read-only).
BENCHMARKS_DIR = SHARED_DIR / "data" / "benchmarks"


@pytest.fixture(autouse=True)
def _test_llm_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM tests' API key variable (``api_key_env="PRORAG_TEST_LLM_KEY"``) set to a dummy: a
    key that is needed but missing is an error before any request. Tests checking that unset it."""
    monkeypatch.setenv("PRORAG_TEST_LLM_KEY", "sk-test-dummy")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    a tiny model's ops are too small to gain from two, and on a shared CPU two threads can run
    them far slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def benchmarks_dir() -> Path:
    """Folder of the real benchmark files.

    These tests are core (they pin the loaders to the published schemas), so a missing folder
    is a failure with a clear message, never a silent skip.
    """
    if not BENCHMARKS_DIR.is_dir():
        pytest.fail(f"shared benchmark data not found at {BENCHMARKS_DIR}; set PRORAG_SHARED to the shared folder")
    return BENCHMARKS_DIR


# ----------------------------------------------------------------------------- a tiny built-in world


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny built-in world (seed 0), built once per test session."""
    from prorag.data.world import build_world

    out = tmp_path_factory.mktemp("tiny_world")
    build_world(out, seed=0, size="tiny")
    return out


@pytest.fixture(scope="session")
def tiny_retriever(tiny_world: Path):  # noqa: ANN201 - BM25Retriever, imported lazily
    """BM25 over the tiny world's pages (partitioned by world)."""
    from prorag.data.records import read_passages
    from prorag.retrieval.bm25 import BM25Retriever

    return BM25Retriever(read_passages(tiny_world / "corpus.jsonl"))


@pytest.fixture(scope="session")
def world_tokenizer(tiny_world: Path):  # noqa: ANN201 - a transformers tokenizer
    """The world tokenizer trained on the tiny world (tags special, names single tokens)."""
    from prorag.models.world_tokenizer import train_world_tokenizer, world_tokenizer_texts

    return train_world_tokenizer(world_tokenizer_texts(tiny_world))
