"""The generation-backend contract: every registered backend, driven by the one rollout loop,
writes the same trajectories (ids, ``env_mask``, spans, stop reasons, caps, retrievals) for a
deterministic model, and continues token-id sequences alike (:mod:`prorag.agent.backends.base`).

Run against ``hf`` (the project's decode loop) and against ``vllm`` on a fake vLLM
(``tests/fake_vllm.py``, written against vLLM's API: vLLM cannot be installed here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.backends import ROLLOUT_BACKENDS, check_available, missing_package
from prorag.agent.backends.base import Continuation, Sampling
from prorag.agent.backends.vllm import VLLMBackend, merge_requests
from prorag.agent.gold import render_gold, tokenize_segments
from prorag.agent.rollout import RolloutEngine, action_seed
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.schema import i_traj
from prorag.agent.trajectory import Trajectory
from prorag.data.records import Record, read_records
from prorag.retrieval.bm25 import BM25Retriever
from tests import fake_vllm
from tests.fakes import CycleLM, ReplayLM

BACKENDS = ROLLOUT_BACKENDS.names()


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:10]


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The fake vLLM as the ``vllm`` module, its model registry emptied after the test."""
    module = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm, "MODELS", {})
    return module


def engine_on(backend: str, model: Any, tokenizer: Any, retriever: Any, config: RolloutConfig, request: Any) -> RolloutEngine:
    """A rollout engine on ``backend``: for ``vllm`` the fake engine serves ``model`` under a name."""
    from dataclasses import replace

    if backend == "vllm":
        request.getfixturevalue("vllm")
        name = f"scripted-{id(model)}"
        fake_vllm.MODELS[name] = model
        model.name_or_path = name
    return RolloutEngine(model, tokenizer, retriever, replace(config, backend=backend))


def assert_well_spanned(t: Trajectory) -> None:
    covered = sorted(i for a in t.actions for i in range(*a.span))
    assert set(covered) <= {i for i, m in enumerate(t.env_mask) if m}
    assert len(t.completion_ids) == len(t.env_mask) == len(t.logprobs)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.env_mask, strict=True) if not m)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gold_trajectories_come_out_token_exact(
    backend: str, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], request: Any
) -> None:
    golds = render_gold(records, tiny_retriever, k=3)
    cfg = RolloutConfig(greedy=True, batch_size=4, max_action_tokens=64)
    probe = RolloutEngine(ReplayLM({}, len(world_tokenizer), world_tokenizer.eos_token_id), world_tokenizer, tiny_retriever, cfg)
    targets = {tuple(probe.prompt_ids(g.question)): tokenize_segments(world_tokenizer, g.segments) for g in golds}
    model = ReplayLM({p: ids for p, (ids, _) in targets.items()}, len(world_tokenizer), world_tokenizer.eos_token_id)
    model.generation_config.eos_token_id = [world_tokenizer.eos_token_id, world_tokenizer.get_vocab()["</answer>"]]
    trajs = engine_on(backend, model, world_tokenizer, tiny_retriever, cfg, request).rollout(records)
    assert model.off_script == 0
    for t, gold in zip(trajs, golds, strict=True):
        ids, mask = targets[tuple(t.prompt_ids)]
        assert (t.completion_ids, t.env_mask) == (ids, mask)
        assert t.stop_reason == "answer" and t.valid and i_traj(t.text) and t.answer == gold.answer
        assert [r["doc_ids"] for r in t.retrievals] == [r["doc_ids"] for r in gold.retrievals]
        assert [a.kind for a in t.actions] == ["search", "conclude"] * len(gold.retrievals) + ["answer"]
        assert sorted(i for a in t.actions for i in range(*a.span)) == [i for i, m in enumerate(t.env_mask) if m]
        assert_well_spanned(t)


def _word(tokenizer: Any, text: str) -> int:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_caps_end_runaway_trajectories_alike(
    backend: str, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], request: Any
) -> None:
    v = world_tokenizer.get_vocab()
    word, query = _word(world_tokenizer, " is"), _word(world_tokenizer, " city")
    never = CycleLM({}, word, len(world_tokenizer), world_tokenizer.eos_token_id)
    cut = engine_on(backend, never, world_tokenizer, tiny_retriever, RolloutConfig(greedy=True, max_action_tokens=17), request)
    for t in cut.rollout(records[:3]):
        assert t.stop_reason == "max_action_tokens" and len(t.completion_ids) == 17 and all(t.env_mask) and not t.valid
    loop = {v["<step>"]: word, word: v["</step>"], v["</step>"]: v["<subquery>"], v["<subquery>"]: query, query: v["</subquery>"]}
    searcher = CycleLM(loop, v["<step>"], len(world_tokenizer), world_tokenizer.eos_token_id)
    capped = engine_on(backend, searcher, world_tokenizer, tiny_retriever, RolloutConfig(greedy=True, max_actions=4), request)
    for t in capped.rollout(records[:3]):
        assert t.stop_reason == "max_actions" and len(t.actions) == 4 and t.num_searches == 3
        assert all(r["query"] == "city" and len(r["doc_ids"]) == 3 for r in t.retrievals)
        assert_well_spanned(t)
    long = RolloutConfig(greedy=True, max_actions=50, max_completion_tokens=150)
    for t in engine_on(backend, searcher, world_tokenizer, tiny_retriever, long, request).rollout(records[:2]):
        assert t.stop_reason == "max_completion_tokens" and len(t.completion_ids) <= 150


def _tiny_llama(world_tokenizer: Any) -> torch.nn.Module:
    """A random tiny Llama whose head leans towards the stop tags (several turns per trajectory)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    from tests.agent.test_rollout import _tiny_config  # the random test models' shape, shared

    cfg = LlamaConfig(**_tiny_config(world_tokenizer))
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        v = world_tokenizer.get_vocab()
        for tag, bias in (("</subquery>", 4.0), ("</subanswer>", 3.0), ("</answer>", 2.0), ("<subquery>", 3.0)):
            model.lm_head.weight[v[tag]] += bias * model.model.norm.weight.sign() * 0.5
    return model


def test_a_real_model_writes_the_same_greedy_trajectories_on_every_backend(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], request: Any
) -> None:
    """Greedy decoding of a real (random) model: the same tokens, masks, spans, stop reasons and
    log-probabilities (up to float noise: the fake recomputes every step, hf reads its KV cache),
    also when continuing from states with ``close_turn`` (tree search)."""
    model = _tiny_llama(world_tokenizer)
    cfg = RolloutConfig(greedy=True, batch_size=4, max_action_tokens=12, max_actions=4)
    runs = {b: engine_on(b, model, world_tokenizer, tiny_retriever, cfg, request) for b in BACKENDS}
    outs = {b: e.rollout(records[:6]) for b, e in runs.items()}
    ref = outs["hf"]
    assert sum(t.num_searches for t in ref) >= 1 and len({len(t.completion_ids) for t in ref}) > 1
    for b, trajs in outs.items():
        for t, r in zip(trajs, ref, strict=True):
            assert (t.completion_ids, t.env_mask, t.stop_reason, t.retrievals) == (
                r.completion_ids,
                r.env_mask,
                r.stop_reason,
                r.retrievals,
            ), b
            assert [(a.kind, a.span, a.well_formed) for a in t.actions] == [(a.kind, a.span, a.well_formed) for a in r.actions]
            assert max((abs(x - y) for x, y in zip(t.logprobs, r.logprobs, strict=True)), default=0.0) < 1e-4
    # Continuing from states (prompt + first action and its reply), one action each, the reply included.
    states = [t.prompt_ids + t.completion_ids[: t.actions[0].span[1]] for t in ref[:3]]
    nxt = {b: e.rollout(records[:3], prompt_ids=states, max_actions=[1, 1, 1], close_turn=True) for b, e in runs.items()}
    for a, b in zip(nxt["hf"], nxt["vllm"], strict=True):
        assert (a.completion_ids, a.env_mask, a.stop_reason) == (b.completion_ids, b.env_mask, b.stop_reason)


@pytest.mark.parametrize("backend", BACKENDS)
def test_continue_batch_stops_on_a_stop_id_or_the_cap(
    backend: str, world_tokenizer: Any, tiny_retriever: BM25Retriever, request: Any
) -> None:
    """The backend contract itself: ids sampled to a stop id (kept, last) or the cap, their
    log-probabilities, ``stop``/``length``; in request order."""
    v = world_tokenizer.get_vocab()
    word = _word(world_tokenizer, " is")
    model = CycleLM({word: word, v["<step>"]: v["</subquery>"]}, word, len(world_tokenizer), world_tokenizer.eos_token_id)
    engine = engine_on(backend, model, world_tokenizer, tiny_retriever, RolloutConfig(greedy=True), request)
    sampling = engine.sampling
    assert v["</subquery>"] in sampling.stop_ids and world_tokenizer.eos_token_id in sampling.stop_ids
    requests = [Continuation((word, word), 5), Continuation((word, v["<step>"]), 5), Continuation((word,), 2)]
    done = engine.backend.continue_batch(requests, sampling)
    assert [d.ids for d in done] == [[word] * 5, [v["</subquery>"]], [word] * 2]
    assert [d.finish for d in done] == ["length", "stop", "length"]
    assert all(len(d.logprobs) == len(d.ids) and all(abs(x) < 1e-6 for x in d.logprobs) for d in done)


def test_vllm_gets_ids_the_action_cap_stop_ids_and_a_seed_per_request(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], vllm: Any
) -> None:
    """What the loop asks vLLM for: token-id prompts holding the prompt, every earlier action and
    every retrieved block; the closing tags and end-of-sequence as stop ids; the action cap as
    ``max_tokens``; the sampled token's log-probability; a seed per request (a row's own with
    ``row_seeds``); one request with ``n`` for rows that share a context and consecutive seeds;
    the engine built with prefix caching and logprobs after temperature."""
    model = _tiny_llama(world_tokenizer)
    fake_vllm.MODELS["tiny"] = model
    model.name_or_path = "tiny"
    cfg = RolloutConfig(backend="vllm", temperature=1.0, max_action_tokens=10, max_actions=3, batch_size=8)
    engine = RolloutEngine(model, world_tokenizer, tiny_retriever, cfg)
    (llm,) = fake_vllm.LLM.instances
    assert llm.kwargs["enable_prefix_caching"] is True and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["gpu_memory_utilization"] == cfg.vllm.gpu_memory_utilization
    seeds = [7, 8, 9]
    trajs = engine.rollout(records[:3], row_seeds=seeds)
    v = world_tokenizer.get_vocab()
    closing = {v[t] for t in ("</subquery>", "</subanswer>", "</answer>")} | {world_tokenizer.eos_token_id}
    for turn, (_, params) in enumerate(llm.calls):
        for p in params:
            assert set(p.stop_token_ids) == closing and p.max_tokens == 10 and p.logprobs == 0 and p.n == 1
            assert p.seed in {action_seed(s, turn) for s in seeds} and p.temperature == 1.0
    assert [p.seed for p in llm.calls[0][1]] == [action_seed(s, 0) for s in seeds]
    # A later turn's prompt is the row's prompt plus its completion so far (actions and retrieved blocks), as ids.
    t = max(trajs, key=lambda t: len(t.actions))
    assert len(t.actions) > 1
    seen = [p for prompts, _ in llm.calls for p in prompts]
    first_end = t.actions[1].span[0]
    assert t.prompt_ids + t.completion_ids[:first_end] in seen
    # The same row with its seed alone: the same trajectory (the row's seed decides, not its batch).
    alone = engine.rollout([records[1]], row_seeds=[seeds[1]])[0]
    assert alone.completion_ids == trajs[1].completion_ids
    # Log-probabilities are the policy's at the sampling temperature (top_p 1): a clean forward gives them.
    with torch.no_grad():
        for tr in trajs:
            logp = model(torch.tensor([tr.prompt_ids + tr.completion_ids])).logits.float().log_softmax(-1)[0]
            p = len(tr.prompt_ids)
            for i, (tid, m, lp) in enumerate(zip(tr.completion_ids, tr.env_mask, tr.logprobs, strict=True)):
                if m:
                    assert abs(logp[p + i - 1, tid].item() - lp) < 1e-4
    # Without row seeds, a group of rows with one question is one request with n (and samples as separate ones would).
    llm.calls.clear()
    group = engine.rollout([records[0]] * 4, seed=5)
    first_prompts, first_params = llm.calls[0]
    assert len(first_prompts) == 1 and first_params[0].n == 4
    assert len({tuple(t.completion_ids) for t in group}) > 1, "the n children draw differently"


def test_merge_requests_keeps_what_is_sampled() -> None:
    a, b = (1, 2), (1, 3)
    reqs = [
        Continuation(a, 4, 10),
        Continuation(a, 4, 11),
        Continuation(a, 4, 13),
        Continuation(b, 4, 14),
        Continuation(b, 4, 15),
    ]
    assert [(r.seed, n) for r, n in merge_requests(reqs, greedy=False)] == [(10, 2), (13, 1), (14, 2)]
    assert [n for _, n in merge_requests(reqs, greedy=True)] == [1] * 5
    assert [n for _, n in merge_requests([Continuation(a, 4, None)] * 2, greedy=False)] == [1, 1]


def test_vllm_backend_reads_vllm_outputs(vllm: Any) -> None:
    """Token ids, the sampled token's log-probability from ``{id: Logprob}``, ``finish_reason``;
    an aborted request is an error, not a trajectory."""

    class Engine:
        def generate(self, prompts: Any, params: Any, use_tqdm: bool = True) -> Any:
            outs = []
            for p, sp in zip(prompts, params, strict=True):
                lps = [{5: fake_vllm.Logprob(-0.5, 1)}, {9: fake_vllm.Logprob(-1.5, 2), 4: fake_vllm.Logprob(-0.1, 1)}]
                done = [fake_vllm.CompletionOutput(i, "", [5, 9], None, lps, "stop", 9) for i in range(sp.n)]
                outs.append(fake_vllm.RequestOutput("r", None, p["prompt_token_ids"], None, done[::-1], True))
            return outs

    backend = VLLMBackend(Engine())
    out = backend.continue_batch([Continuation((1,), 4, 3), Continuation((1,), 4, 4)], Sampling(1.0, 1.0, False, (9,)))
    assert [(o.ids, o.logprobs, o.finish) for o in out] == [([5, 9], [-0.5, -1.5], "stop")] * 2

    class Aborting(Engine):
        def generate(self, prompts: Any, params: Any, use_tqdm: bool = True) -> Any:
            outs = super().generate(prompts, params)
            outs[0].outputs[0].finish_reason = "abort"
            return outs

    with pytest.raises(RuntimeError, match="abort"):
        VLLMBackend(Aborting()).continue_batch([Continuation((1,), 4, 3)], Sampling(1.0, 1.0, False, (9,)))


def test_vllm_missing_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr("prorag.agent.backends.has_module", lambda package: False)
    assert missing_package("hf") is None
    reason = missing_package("vllm")
    assert reason is not None and "pip install 'prorag[vllm]'" in reason and "\n" not in reason
    from prorag.stages.rl.config import RLConfig

    with pytest.raises(ValueError, match=r"prorag\[vllm\]"):
        check_available(RLConfig(rollout=RolloutConfig(backend="vllm", max_actions=11)))
    check_available(RLConfig())


def test_later_fields_hold_the_vllm_block_default() -> None:
    """Run folders made before ``rollout.backend`` existed match while it is ``hf`` and the vLLM
    block keeps its defaults (:data:`~prorag.core.config.LATER_FIELDS`)."""
    from dataclasses import asdict

    from prorag.agent.rollout_config import VLLMSettings
    from prorag.core.config import LATER_FIELDS, without_later_fields

    assert LATER_FIELDS["vllm"] == asdict(VLLMSettings()) and LATER_FIELDS["backend"] == "hf"
    plain = without_later_fields(RolloutConfig())
    assert "backend" not in plain and "vllm" not in plain
    assert without_later_fields(RolloutConfig(backend="vllm"))["backend"] == "vllm"
