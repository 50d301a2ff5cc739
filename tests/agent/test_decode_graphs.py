"""The static decode step (what CUDA graphs replay): bucketed shapes, a slot pool whose buffers
never move, and the rollout contract of the slot cache kept token for token. On CPU the step runs
eagerly (``decode_graphs="eager"``); capture itself needs a GPU (``benchmarks/decode_graphs.py``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.decode_graphs import (
    MAX_CAPTURE_FAILURES,
    SLOT_ATTENTION,
    WIDTH_BUCKET,
    DecodeGraphs,
    batch_bucket,
    grouped_attention,
    width_bucket,
)
from prorag.agent.kv_cache import SlotCache, SlotPool
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.data.records import Record, read_records
from prorag.retrieval.bm25 import BM25Retriever
from tests.agent.test_rollout import _logprob_drift, _tiny_llama


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:12]


def test_batch_buckets_are_powers_of_two_then_multiples_of_eight() -> None:
    got = [batch_bucket(n, 64) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 63, 64)]
    assert got == [1, 2, 4, 4, 8, 8, 16, 16, 24, 64, 64]
    assert batch_bucket(5, 6) == 6  # capped at the rows the graphs hold
    for bad in (0, 65):
        with pytest.raises(ValueError, match="row"):
            batch_bucket(bad, 64)
    assert [width_bucket(u) for u in (1, WIDTH_BUCKET, WIDTH_BUCKET + 1)] == [WIDTH_BUCKET, WIDTH_BUCKET, 2 * WIDTH_BUCKET]


def test_select_compacts_rows_in_place() -> None:
    """Dropping rows moves the kept ones to the front of the same buffers (a graph's addresses)."""
    pool = SlotPool(4)
    cache = SlotCache(4, torch.device("cpu"), pool=pool)
    cache.reserve(8)
    keys = torch.randn(4, 2, 3, 5)
    cache.slots, cache.width, cache.seen = torch.arange(3).repeat(4, 1), 8, 3
    cache.update(keys, keys + 1, 0)
    layer = pool.layers[0]
    before = (layer.keys.data_ptr(), layer.values.data_ptr())
    cache.select(torch.tensor([3, 1]))
    assert (layer.keys.data_ptr(), layer.values.data_ptr()) == before
    torch.testing.assert_close(layer.keys[:2, :, :3], keys[[3, 1]], rtol=0, atol=0)
    torch.testing.assert_close(layer.values[:2, :, :3], keys[[3, 1]] + 1, rtol=0, atol=0)
    assert cache.rows.tolist() == [3, 1]
    # A new batch on the same pool reuses its layers and capacity; a grown capacity is a new generation.
    again = SlotCache(3, torch.device("cpu"), pool=pool)
    assert again.layers is pool.layers and layer.owner is again and again.capacity == pool.capacity
    generation = pool.generation
    again.reserve(pool.capacity + 1)
    assert pool.generation == generation + 1 and layer.keys.shape[2] == pool.capacity
    with pytest.raises(ValueError, match="cannot hold a batch of 5"):
        SlotCache(5, torch.device("cpu"), pool=pool)


@pytest.mark.parametrize("attention", ["model", SLOT_ATTENTION])
def test_static_decode_keeps_the_slot_cache_contract_token_for_token(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], monkeypatch: Any, attention: str
) -> None:
    """Sampled with per-row seeds, rows ending mid-turn and leaving: the static step (padded
    batches, wide buckets, one pool across calls) writes what the eager slot cache and the
    model's own cache write, with log-probabilities that match a clean forward."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=4, batch_size=12, temperature=1.0, top_p=0.95, decode_graphs="eager")
    seeds = [11 + 5 * i for i in range(len(records))]
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    calls = []
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, SLOT_ATTENTION, lambda *a, **k: calls.append(1) or grouped_attention(*a, **k))
    if attention != "model":
        engine.graphs = DecodeGraphs(model, cfg.batch_size, torch.device("cpu"), capture=False, attention=attention)
    static = engine.rollout(records, row_seeds=seeds)
    graphs = engine.graphs
    assert isinstance(graphs, DecodeGraphs) and not graphs.capture and graphs.attention == attention
    assert bool(calls) == (attention == SLOT_ATTENTION), "the step runs the attention it was given"
    rows_seen = {rows for rows, _ in graphs.shapes}
    assert len(rows_seen) > 1, "rows should leave, so the batch shrinks through buckets"
    assert rows_seen <= {1, 2, 4, 8, 12}
    assert all(width % WIDTH_BUCKET == 0 for _, width in graphs.shapes)
    assert _logprob_drift(model, static) < 1e-4

    references = []
    for mode, slot_cache in (("off", True), ("off", False)):
        engine_ref = RolloutEngine(model, world_tokenizer, tiny_retriever, replace(cfg, decode_graphs=mode))
        engine_ref.static_cache = slot_cache
        references.append(engine_ref.rollout(records, row_seeds=seeds))
        assert engine_ref.graphs is None
    for reference in references:
        for a, b in zip(static, reference, strict=True):
            assert (a.completion_ids, a.env_mask, a.stop_reason) == (b.completion_ids, b.env_mask, b.stop_reason)
            assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < 1e-4

    # The next call reuses the pool and meets no new shape; a smaller batch stays on the same graphs.
    shapes = set(graphs.shapes)
    assert [t.completion_ids for t in engine.rollout(records, row_seeds=seeds)] == [t.completion_ids for t in static]
    assert engine.graphs is graphs and graphs.shapes == shapes
    alone = engine.rollout(records[:1], row_seeds=seeds[:1])[0]
    assert engine.graphs is graphs and alone.completion_ids == static[0].completion_ids


def test_greedy_static_decode_equals_the_eager_slot_cache(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    model = _tiny_llama(world_tokenizer, seed=1)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=5, batch_size=5, greedy=True)
    eager = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg).rollout(records)
    static = RolloutEngine(model, world_tokenizer, tiny_retriever, replace(cfg, decode_graphs="eager")).rollout(records)
    assert sum(t.num_searches for t in static) >= 3
    assert [t.completion_ids for t in static] == [t.completion_ids for t in eager]
    assert max(abs(x - y) for a, b in zip(static, eager) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


@pytest.mark.slow
def test_compiled_static_decode_writes_what_the_uncompiled_step_writes(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record]
) -> None:
    """``compile_decode``: the whole static step compiled (one program, no graph break, a few
    compilations for every bucket) samples what the uncompiled step samples (per-row streams),
    with log-probabilities that match a clean forward."""
    import torch._dynamo.utils as dynamo_utils

    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=4, batch_size=12, temperature=1.0, top_p=0.95, decode_graphs="eager")
    seeds = [11 + 5 * i for i in range(len(records))]
    static = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg).rollout(records, row_seeds=seeds)
    dynamo_utils.counters.clear()
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, replace(cfg, compile_decode=True))
    compiled = engine.rollout(records, row_seeds=seeds)
    assert engine.graphs is not None and engine.graphs.compiled
    assert len({rows for rows, _ in engine.graphs.shapes}) > 1, "rows should leave, so the batch shrinks through buckets"
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])
    assert 1 <= dynamo_utils.counters["stats"]["unique_graphs"] <= 4
    assert [t.completion_ids for t in compiled] == [t.completion_ids for t in static]
    assert _logprob_drift(model, compiled) < 1e-4
    with pytest.raises(ValueError, match="compile_decode"):
        RolloutConfig(compile_decode=True, decode_graphs="off")


def test_graphs_engage_only_where_they_can(world_tokenizer: Any, tiny_retriever: BM25Retriever) -> None:
    model = _tiny_llama(world_tokenizer)
    for mode, expected in (("auto", None), ("off", None)):  # auto: CUDA only; this is a CPU
        assert (
            RolloutEngine(model, world_tokenizer, tiny_retriever, RolloutConfig(decode_graphs=mode)).decode_graphs_for(4)
            is expected
        )
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, RolloutConfig(decode_graphs="eager", batch_size=4))
    small = engine.decode_graphs_for(3)
    assert small is not None and small.max_rows == 4 and engine.decode_graphs_for(4) is small
    assert engine.decode_graphs_for(6).max_rows == 6  # a larger batch gets a larger pool
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(model, 4, torch.device("cpu"), capture=True)
    with pytest.raises(ValueError, match="decode_graphs must be one of"):
        RolloutConfig(decode_graphs="always")


@pytest.mark.parametrize("mode", ["off", "eager"])
def test_eager_forwards_run_without_cudnn_attention_and_the_static_step_keeps_the_default(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], mode: str
) -> None:
    """Prompts, the environment's replies and eager decode steps change shape at every call and run
    without cuDNN's attention (prorag.core.kernels); the static step a graph records
    keeps PyTorch's choice (a replay does no per-call set-up)."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=4, batch_size=6, temperature=1.0, decode_graphs=mode)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    seen: list[tuple[int, bool]] = []  # (query length, cuDNN attention allowed) of every forward
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append((kwargs["input_ids"].shape[1], torch.backends.cuda.cudnn_sdp_enabled())),
        with_kwargs=True,
    )
    try:
        engine.rollout(records[:6], row_seeds=list(range(6)))
    finally:
        hook.remove()
    chunks = [allowed for width, allowed in seen if width > 1]
    steps = [allowed for width, allowed in seen if width == 1]
    assert chunks and steps and not any(chunks)
    assert not any(steps) if mode == "off" else all(steps)
    assert torch.backends.cuda.cudnn_sdp_enabled()


class _ReplayedStep:
    """A stand-in for a captured graph on a CPU: replay runs the static step into the graph's logits."""

    def __init__(self, graphs: DecodeGraphs, cache: SlotCache, rows: int, width: int) -> None:
        self.args = (graphs, cache, rows, width)
        self.logits = graphs._step(cache, rows, width)

    def replay(self) -> None:
        graphs, cache, rows, width = self.args
        self.logits.copy_(graphs._step(cache, rows, width))


def test_a_failed_capture_drops_the_graphs_and_captures_afresh_until_the_limit(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], monkeypatch: Any, caplog: Any
) -> None:
    """One failed capture no longer costs a rollout every graph: the graphs and their pool are
    dropped, the failed step runs eagerly, and later steps capture again; only after
    MAX_CAPTURE_FAILURES failures do the steps stay eager. Rollouts are unchanged throughout."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(max_action_tokens=24, max_actions=4, batch_size=6, temperature=1.0, decode_graphs="eager")
    seeds = [11 + 5 * i for i in range(6)]
    reference = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg).rollout(records[:6], row_seeds=seeds)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    graphs = engine.graphs = DecodeGraphs(model, 6, torch.device("cpu"), capture=False)
    graphs.capture = True  # capture on a CPU: _record below stands in for torch.cuda.graph
    fail_at = {2}  # the second capture fails
    recorded: list[tuple[int, int]] = []

    def record(cache: SlotCache, rows: int, width: int) -> tuple[Any, torch.Tensor]:
        recorded.append((rows, width))
        if len(recorded) in fail_at:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        graphs.captures += 1
        step = _ReplayedStep(graphs, cache, rows, width)
        return step, step.logits

    monkeypatch.setattr(graphs, "_record", record)
    with caplog.at_level("WARNING", logger="prorag.agent.decode_graphs"):
        got = engine.rollout(records[:6], row_seeds=seeds)
    assert [t.completion_ids for t in got] == [t.completion_ids for t in reference]
    assert graphs.capture_failures == 1 and graphs.capture, "one failure: capture goes on"
    # Every graph went with the failure (the first shape's too); the steps after it captured
    # again, the shape that failed first of all.
    assert graphs.captures == len(recorded) - 1 and recorded[2] == recorded[1]
    assert set(graphs.graphs) == set(recorded[2:]) and recorded[0] not in graphs.graphs
    assert "failure 1 of" in caplog.text and "captured afresh" in caplog.text

    fail_at.update(range(len(recorded) + 1, len(recorded) + 100))  # every capture from now on fails
    graphs._drop_graphs()
    again = engine.rollout(records[:6], row_seeds=seeds)
    assert [t.completion_ids for t in again] == [t.completion_ids for t in reference]
    assert graphs.capture_failures == MAX_CAPTURE_FAILURES and not graphs.capture and not graphs.graphs
    assert "decode steps run eagerly from now on" in caplog.text


@pytest.mark.parametrize("queries", [1, 3], ids=["decode", "chunk"])
def test_grouped_attention_equals_attention_with_repeated_heads(queries: int) -> None:
    """Query heads sharing a key/value head, on a strided view of a wider pool, against a plain
    softmax attention over heads repeated explicitly (boolean mask; rows see different spans)."""
    torch.manual_seed(0)
    B, H, kv, D, cap, width = 3, 6, 2, 8, 20, 12
    pool_k, pool_v = torch.randn(B + 1, kv, cap, D), torch.randn(B + 1, kv, cap, D)
    key, value = pool_k[:B, :, :width], pool_v[:B, :, :width]
    query = torch.randn(B, H, queries, D)
    last = torch.tensor([4, 11, 7])[:, None] + torch.arange(queries)[None, :] - queries + 1  # each query's own slot
    mask = (torch.arange(width) <= last[:, :, None])[:, None]  # (B, 1, q, W)
    out, weights = grouped_attention(None, query, key, value, mask, scaling=0.3)
    k_rep, v_rep = key.repeat_interleave(H // kv, dim=1), value.repeat_interleave(H // kv, dim=1)
    scores = (query @ k_rep.transpose(-1, -2)) * 0.3
    reference = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v_rep
    assert weights is None and out.shape == (B, queries, H, D)
    torch.testing.assert_close(out, reference.transpose(1, 2), rtol=1e-5, atol=1e-5)
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(grouped_attention(None, query, key, value, additive, scaling=0.3)[0], out, rtol=1e-5, atol=1e-5)
