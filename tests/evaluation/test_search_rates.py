"""Over- and under-search rates as evaluation metrics (HiPRAG, docs/METHOD.md §3) for any system:
rates over steps in ``summarise``, and the harness's re-ask (``over_search``) on gold trajectories
whose policy knows each question's first hop without documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine
from prorag.agent.schema import render_conclude
from prorag.data.jsonl import read_jsonl
from prorag.data.records import read_records
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import evaluate, summarise
from prorag.retrieval.bm25 import BM25Retriever
from prorag.supervision.hiprag import search_queries
from tests.fakes import ReplayLM


def test_rates_are_over_steps_and_absent_without_their_counts() -> None:
    base = {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "substring_acc": 1.0, "format_valid": True, "retrieval_steps": 1}
    rows = [
        {**base, "stop_reason": "answer", "search_steps": 3, "non_search_steps": 1, "over_search": 1, "under_search": 1},
        {**base, "stop_reason": "answer", "search_steps": 1, "non_search_steps": 3, "over_search": 0, "under_search": 0},
        {**base, "stop_reason": "answer", "search_steps": 4, "non_search_steps": 4},  # no judgements: not counted
    ]
    m = summarise(rows)
    assert m["over_search_rate"] == pytest.approx(1 / 4) and m["under_search_rate"] == pytest.approx(1 / 4)
    m = summarise([rows[2]])
    assert m["over_search_rate"] is None and m["under_search_rate"] is None


def test_harness_reasks_search_steps_when_asked(
    tmp_path: Path, tiny_world: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever
) -> None:
    records = read_records(tiny_world / "test.jsonl")[:6]
    golds = render_gold(records, tiny_retriever, k=3)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments)[0] for g in golds}
    # Asked a record's first sub-query with no documents, the policy states its gold sub-answer.
    known = set()
    for r, g in zip(records, golds, strict=True):
        first = search_queries(g.text)[0]
        known.add(first)
        said = render_conclude("known", r.metadata["decomposition"][0]["answer"])
        targets[tuple(probe.prompt_ids(first))] = tokenize_segments(world_tokenizer, [(said, True)])[0]
    model = ReplayLM(targets, len(world_tokenizer), world_tokenizer.eos_token_id)
    rollout = EvalRolloutConfig(batch_size=6)

    plain = evaluate(
        model, world_tokenizer, records, tiny_retriever, tmp_path / "plain", EvalConfig(rollout=rollout), progress=False
    )
    rows = list(read_jsonl(tmp_path / "plain" / "predictions.jsonl"))
    assert plain["em"] == 1.0 and plain["over_search_rate"] is None and all("over_search" not in r for r in rows)
    assert plain["under_search_rate"] is None  # gold trajectories conclude only after a search: no non-search step
    assert [r["search_steps"] for r in rows] == [len(search_queries(g.text)) for g in golds]

    cfg = EvalConfig(rollout=rollout, over_search=True)
    judged = evaluate(model, world_tokenizer, records, tiny_retriever, tmp_path / "judged", cfg, progress=False)
    rows = list(read_jsonl(tmp_path / "judged" / "predictions.jsonl"))
    # Every search step whose sub-query is known is over-search (another record's first hop too).
    over = [sum(q in known for q in search_queries(g.text)) for g in golds]
    assert [r["over_search"] for r in rows] == over and min(over) >= 1
    assert judged["over_search_rate"] == pytest.approx(sum(over) / sum(r["search_steps"] for r in rows))
