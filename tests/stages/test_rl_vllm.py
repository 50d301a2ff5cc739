"""RL with ``rollout.backend: vllm`` through TRL's vLLM integration, on CPU with a fake vLLM
(``tests/fake_vllm.py``; vLLM cannot be installed here) and a fake ``trl vllm-serve``.

What is tested: the TRL arguments the stage builds; colocate mode end to end through TRL's own
``VLLMGeneration`` (its ``LLM(...)`` construction, its weight sync after each optimiser step, its
importance-sampling correction), the rollout loop driving TRL's engine and the logged sampler
mismatch; server mode at the level TRL allows on CPU: the rollout loop driving TRL's ``VLLMClient``
against a local fake of the server's HTTP endpoints (TRL's own server-mode setup opens an NCCL
weight-transfer group, which needs a real vLLM and a GPU)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.backends.vllm import VLLMServerBackend
from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig, VLLMSettings
from prorag.data.records import Record, read_records
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages import rl
from prorag.stages.rl import RLConfig, train_rl
from prorag.stages.rl.run import rl_training_args
from tests import fake_vllm
from tests.fake_vllm_server import FakeVLLMServer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "train.jsonl")[:4]


class FakePRM:
    def score_trajectories(self, trajectories: Any) -> list[list[float]]:
        return [[float(sum(t.completion_ids[a.span[0] : a.span[1]]) % 7 - 3) for a in t.actions] for t in trajectories]


def vllm_config(**kw: Any) -> RLConfig:
    rollout = RolloutConfig(backend="vllm", max_action_tokens=12, max_actions=3, max_completion_tokens=48, batch_size=64)
    base = dict(
        group_size=2, per_device_batch_size=4, rollout=rollout, learning_rate=1e-2, max_steps=2, save_steps=1, logging_steps=1
    )
    return RLConfig(**(base | kw))


def test_trl_arguments_for_each_mode(tmp_path: Path) -> None:
    hf = rl_training_args(vllm_config(rollout=RolloutConfig(max_actions=11)), tmp_path)
    assert hf.use_vllm is False
    colocated = rl_training_args(
        vllm_config(rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.45))), tmp_path
    )
    assert colocated.use_vllm and colocated.vllm_mode == "colocate" and colocated.vllm_gpu_memory_utilization == 0.45
    assert colocated.vllm_importance_sampling_correction and colocated.vllm_server_base_url is None
    served = rl_training_args(vllm_config(vllm_mode="server", vllm_server_url="http://10.0.0.2:8000"), tmp_path)
    assert served.use_vllm and served.vllm_mode == "server" and served.vllm_server_base_url == "http://10.0.0.2:8000"


def test_colocated_memory_is_checked_in_the_config() -> None:
    """A colocated engine must leave the trainer (and a learned PRM) its share of the GPU."""
    with pytest.raises(ValueError, match="gpu_memory_utilization 0.9 leaves 0.10 of the GPU to the trainer"):
        vllm_config(process_reward="none", rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.9)))
    with pytest.raises(ValueError, match="the trainer and the PRM it scores with, which needs at least 0.3"):
        vllm_config(rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.75)))
    vllm_config(process_reward="none", rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.75)))
    vllm_config(vllm_mode="server", rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.9)))
    RLConfig(rollout=RolloutConfig(max_actions=11, vllm=VLLMSettings(gpu_memory_utilization=0.9)))  # hf: unread
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1 with vllm_mode 'colocate'"):
        vllm_config(rollout=RolloutConfig(backend="vllm", vllm=VLLMSettings(tensor_parallel_size=2)))
    with pytest.raises(ValueError, match="vllm_mode must be one of"):
        vllm_config(vllm_mode="remote")


@pytest.fixture
def trl_with_fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake vLLM installed, and TRL told it is there (TRL checks for the ``vllm`` distribution,
    and imports ``LLM`` at its own import, before the fake exists). TRL's colocated setup writes the
    torch.distributed variables into the environment: restored after the test."""
    import trl.generation.vllm_client as client_module
    import trl.generation.vllm_generation as generation_module

    vllm = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm, "MODELS", {})
    monkeypatch.setattr(generation_module, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(client_module, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(generation_module, "LLM", vllm.LLM, raising=False)
    monkeypatch.setattr(generation_module, "SamplingParams", vllm.SamplingParams, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)


def test_colocated_vllm_trains_through_trl(
    tmp_path: Path, world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], trl_with_fake_vllm: None
) -> None:
    """TRL builds the colocated engine from the policy's folder name (processed log-probabilities),
    pushes the trained weights into it before each step's rollouts, and the rollout loop samples
    every action on it; the sampler's log-probabilities then match the trained policy's (TRL's
    recomputation, up to float noise), which the logged mismatch shows at every step: the engine
    started on perturbed weights, so without TRL's sync it would be far from 0."""
    model = make_tiny_model(world_tokenizer)
    model.name_or_path = "tiny-policy"
    served = copy.deepcopy(model)
    with torch.no_grad():
        for p in served.parameters():
            p.add_(0.05)  # the engine starts on other weights: only TRL's sync makes them the policy's
    fake_vllm.MODELS["tiny-policy"] = served
    train_rl(
        vllm_config(),
        tmp_path,
        model=model,
        tokenizer=world_tokenizer,
        records=records,
        retriever=tiny_retriever,
        scorer=FakePRM(),
    )
    (llm,) = fake_vllm.LLM.instances
    assert llm.model_name == "tiny-policy" and llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.kwargs["gpu_memory_utilization"] == 0.3 and llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.prefix_resets >= 2, "TRL synced the weights (and reset the prefix cache) before each step's rollouts"
    turns = [params for _, params in llm.calls]
    assert len(turns) >= 2 and all(p.max_tokens == 12 and p.logprobs == 0 and p.seed is not None for ps in turns for p in ps)
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[n]) for n, p in served.named_parameters()), "the engine holds the trained weights"
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    logged = [row for row in map(json.loads, lines) if "sampler_logratio_mean" in row]
    assert len(logged) == 2, "the mismatch is logged every step"
    for row in logged:
        assert abs(row["sampler_logratio_mean"]) < 1e-4 and row["sampler_logratio_max"] < 1e-3, row
        assert "sampling/importance_sampling_ratio/mean" in row, "TRL's own correction ran"


def test_server_mode_rollouts_drive_trls_client(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, records: list[Record], trl_with_fake_vllm: None
) -> None:
    """The rollout loop on a ``trl vllm-serve`` server through TRL's ``VLLMClient``: greedy, the
    same trajectories as the ``hf`` backend; sampled, a seed and the stop ids in every request."""
    from trl.generation.vllm_client import VLLMClient

    model = make_tiny_model(world_tokenizer).eval()
    fake_vllm.MODELS["served"] = model
    llm = fake_vllm.LLM("served", logprobs_mode="processed_logprobs")
    greedy = RolloutConfig(greedy=True, max_action_tokens=10, max_actions=3)
    reference = RolloutEngine(model, world_tokenizer, tiny_retriever, greedy).rollout(records)
    with FakeVLLMServer(llm) as server:
        backend = VLLMServerBackend(VLLMClient(base_url=server.url))
        engine = RolloutEngine(model, world_tokenizer, tiny_retriever, greedy, backend=backend)
        got = engine.rollout(records)
        for a, b in zip(got, reference, strict=True):
            assert (a.completion_ids, a.env_mask, a.stop_reason) == (b.completion_ids, b.env_mask, b.stop_reason)
            assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0) < 1e-4
        server.bodies.clear()
        sampled = RolloutEngine(
            model, world_tokenizer, tiny_retriever, RolloutConfig(max_action_tokens=10, max_actions=3), backend=backend
        )
        sampled.rollout(records, row_seeds=[1, 2, 3, 4])
        assert server.bodies and all("seed" in b and b["logprobs"] == 0 and b["max_tokens"] == 10 for b in server.bodies)
        assert all(set(b["stop_token_ids"]) == set(engine.sampling.stop_ids) for b in server.bodies)


def test_server_client_on_other_processes(monkeypatch: pytest.MonkeyPatch, trl_with_fake_vllm: None) -> None:
    """Only TRL's main process holds a client; another process makes its own on the same server."""
    from types import SimpleNamespace

    made: list[dict[str, Any]] = []
    monkeypatch.setattr("trl.generation.vllm_client.VLLMClient", lambda **kw: made.append(kw) or SimpleNamespace(**kw))
    generation = SimpleNamespace(
        server_base_url="http://h:1", server_host="x", server_port=2, server_timeout=5.0, vllm_client=None
    )
    client = rl.rollouts.server_client(generation)
    assert made == [{"base_url": "http://h:1", "connection_timeout": 5.0}] and generation.vllm_client is client
    assert rl.rollouts.server_client(generation) is client
