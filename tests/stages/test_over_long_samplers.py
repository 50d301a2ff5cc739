"""The samplers skip a question too long for the policy's context with a counted warning, and
search the others (MCTS here; RFT, RL and the PRM audit share the same check)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from prorag.data.records import Record, read_records
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.mcts import MCTSConfig, TreeSearch, read_trees, run_mcts

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mcts_skips_an_over_long_question_with_a_counted_warning(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, caplog: pytest.LogCaptureFixture
) -> None:
    short = read_records(tiny_world / "test.jsonl")[:2]
    long = Record("over-long", " ".join([short[0].question] * 50), short[0].golden_answers, dict(short[0].metadata))
    model = make_tiny_model(world_tokenizer, size="tiny", seed=0)
    model.config.max_position_embeddings = 64
    rollout = replace(MCTSConfig().rollout, max_actions=2, max_action_tokens=8, max_completion_tokens=24)
    cfg = MCTSConfig(simulations=1, num_candidates=2, max_depth=2, trees_per_batch=2, rollout=rollout)
    search = TreeSearch(model, world_tokenizer, tiny_retriever, cfg)
    with caplog.at_level(logging.WARNING, logger="prorag.agent.context_budget"):
        summary = run_mcts([short[0], long, short[1]], tmp_path, search, progress=False)
    assert summary.trees == 2 and [t.id for t in read_trees(tmp_path)] == [short[0].id, short[1].id]
    assert "MCTS: 1 of 3 questions over the context budget" in caplog.text
