"""MCTS, evaluation and the PRM audit on ``rollout.backend: vllm`` with a standalone engine (no
trainer owns one), on the fake vLLM of ``tests/fake_vllm.py`` loading a saved policy folder: the
stage loads no weights itself (:func:`~prorag.models.checkpoints.load_sampler`), builds one engine,
and writes what the ``hf`` backend writes for a deterministic (greedy) policy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from prorag.agent.rollout_config import RolloutConfig, VLLMSettings
from prorag.data.records import Record, read_records
from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.harness import evaluate
from prorag.models.checkpoints import PolicyFolder, load_policy, load_sampler, save_policy
from prorag.models.tiny import make_tiny_model
from prorag.retrieval.bm25 import BM25Retriever
from prorag.stages.mcts import MCTSConfig, TreeSearch, read_trees, run_mcts
from tests import fake_vllm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def records(tiny_world: Path) -> list[Record]:
    return read_records(tiny_world / "test.jsonl")[:3]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, world_tokenizer: Any) -> Path:
    return save_policy(make_tiny_model(world_tokenizer), world_tokenizer, tmp_path_factory.mktemp("policy") / "policy")


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm, "MODELS", {})
    return module


def test_load_sampler_loads_no_weights_for_vllm(policy_dir: Path) -> None:
    handle, tokenizer = load_sampler(str(policy_dir), RolloutConfig(backend="vllm"))
    assert isinstance(handle, PolicyFolder) and handle.name_or_path == str(policy_dir)
    assert handle.config.max_position_embeddings > 0 and handle.generation_config.eos_token_id is not None
    assert tokenizer.convert_tokens_to_ids("</answer>") != tokenizer.unk_token_id
    model, _ = load_sampler(str(policy_dir), RolloutConfig())
    assert not isinstance(model, PolicyFolder)


def test_evaluation_on_vllm_writes_what_hf_writes(
    policy_dir: Path, records: list[Record], tiny_retriever: BM25Retriever, tmp_path: Path, vllm: Any
) -> None:
    rollout = dict(max_action_tokens=10, max_actions=3, max_completion_tokens=64)
    hf_model, tokenizer = load_policy(str(policy_dir))
    evaluate(
        hf_model,
        tokenizer,
        records,
        tiny_retriever,
        tmp_path / "hf",
        EvalConfig(rollout=EvalRolloutConfig(**rollout)),
        progress=False,
    )
    handle, tokenizer = load_sampler(str(policy_dir), RolloutConfig(backend="vllm"))
    cfg = EvalConfig(rollout=EvalRolloutConfig(**rollout, backend="vllm", vllm=VLLMSettings(gpu_memory_utilization=0.85)))
    evaluate(handle, tokenizer, records, tiny_retriever, tmp_path / "vllm", cfg, progress=False)
    (llm,) = fake_vllm.LLM.instances
    assert llm.model_name == str(policy_dir) and llm.kwargs["gpu_memory_utilization"] == 0.85
    for name in ("trajectories.jsonl", "predictions.jsonl"):
        hf_rows = [json.loads(x) for x in (tmp_path / "hf" / name).read_text().splitlines()]
        vllm_rows = [json.loads(x) for x in (tmp_path / "vllm" / name).read_text().splitlines()]
        keys = ("completion_ids", "env_mask", "stop_reason", "prediction", "answer")
        assert [{k: r.get(k) for k in keys} for r in hf_rows] == [{k: r.get(k) for k in keys} for r in vllm_rows]


def test_mcts_on_vllm_shares_one_engine(
    policy_dir: Path, records: list[Record], tiny_retriever: BM25Retriever, tmp_path: Path, vllm: Any
) -> None:
    """Expansion and simulation run on one vLLM engine (the sampled trees differ from hf's by the
    samplers' draws; the trajectories' contract is tests/agent/test_backend_contract.py's)."""
    rollout = dict(max_action_tokens=8, max_actions=4, max_completion_tokens=64, batch_size=16)
    cfg = MCTSConfig(simulations=3, num_candidates=2, max_depth=3, rollout=RolloutConfig(**rollout, backend="vllm"))
    handle, tokenizer = load_sampler(str(policy_dir), cfg.rollout)
    search = TreeSearch(handle, tokenizer, tiny_retriever, cfg)
    assert search.simulator.backend is search.expander.backend
    summary = run_mcts(records[:2], tmp_path / "mcts", search, progress=False)
    (llm,) = fake_vllm.LLM.instances
    assert llm.calls, "every action came from the engine"
    trees = read_trees(tmp_path / "mcts" / "trees.jsonl")
    assert len(trees) == 2 and summary is not None
    assert all(t.root.children and t.simulations == 3 for t in trees), "each tree was expanded and simulated"


def test_prm_audit_on_vllm_leaves_the_prm_its_share(
    policy_dir: Path, records: list[Record], tiny_retriever: BM25Retriever, vllm: Any
) -> None:
    from prorag.stages.prm import fresh_sample_audit

    class Scorer:
        def score_trajectories(self, trajectories: Any) -> list[list[float]]:
            return [[float(i % 3) for i, _ in enumerate(t.actions)] for t in trajectories]

    greedy = RolloutConfig(backend="vllm", max_action_tokens=8, max_actions=3, max_completion_tokens=64)
    with pytest.raises(ValueError, match="leaves 0.10 of the GPU to the PRM, which needs at least 0.2"):
        fresh_sample_audit(
            Scorer(), policy_dir, records, tiny_retriever, rollout=replace(greedy, vllm=VLLMSettings(gpu_memory_utilization=0.9))
        )
    audit = fresh_sample_audit(Scorer(), policy_dir, records, tiny_retriever, samples=2, rollout=greedy)
    assert "auc" in audit and len(fake_vllm.LLM.instances) == 1


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs" / "stages").glob("*vllm*.yaml")))
def test_the_gpu_guides_configs_load(name: str) -> None:
    """Each vLLM config docs/GPU.md names loads into its stage's config, on the vllm backend."""
    from prorag.core.config import load_config
    from prorag.stages.rl import RLConfig

    cls = {"rl": RLConfig, "mcts": MCTSConfig, "eval": EvalConfig}[name.split("_", 1)[0]]
    cfg = load_config(REPO / "configs" / "stages" / name, cls)
    assert cfg.rollout.backend == "vllm"
    assert name in (REPO / "docs" / "GPU.md").read_text()
