"""Sampling settings (issue 70): temperature 0 is greedy decoding everywhere; a temperature below 0
or not finite, and a top-p outside (0, 1], are refused where they are declared, naming the field."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from prorag.agent.rollout import RolloutEngine
from prorag.agent.rollout_config import RolloutConfig
from prorag.agent.sampling import sample_next
from prorag.core.setting_checks import check_learning_rate, check_temperature, check_top_p
from prorag.data.records import Record, read_records
from prorag.evaluation.eval_config import EvalRolloutConfig
from prorag.models.generator import Sampling
from prorag.retrieval.bm25 import BM25Retriever
from prorag.supervision.llm_teacher import LLMTeacherConfig
from tests.agent.test_rollout import _tiny_llama


def test_sample_next_at_temperature_zero_is_the_argmax() -> None:
    """Today's code divided the logits by 0: NaN probabilities and an index past the vocabulary."""
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 3.5, 0.0, -2.0], [-1.0, -0.5, -0.25, -3.0]])
    greedy_tokens, greedy_logp = sample_next(logits, temperature=1.0, top_p=1.0, greedy=True, generator=None)
    assert greedy_tokens.tolist() == [1, 1, 2]
    for top_p in (1.0, 0.3):
        for uniforms in (torch.tensor([0.999, 0.0, 0.5]), None):
            tokens, logp = sample_next(
                logits, temperature=0.0, top_p=top_p, greedy=False, generator=torch.Generator().manual_seed(0), uniforms=uniforms
            )
            assert torch.equal(tokens, greedy_tokens) and torch.equal(logp, greedy_logp)


def test_a_rollout_at_temperature_zero_writes_the_greedy_trajectories(
    world_tokenizer: Any, tiny_retriever: BM25Retriever, tiny_world: Path
) -> None:
    """The engine at ``temperature: 0`` (``greedy`` false) decodes as ``greedy: true`` does, with a
    shared generator or per-row streams (today: ``index ... is out of bounds``)."""
    records: list[Record] = read_records(tiny_world / "test.jsonl")[:4]
    model = _tiny_llama(world_tokenizer)
    base = RolloutConfig(max_action_tokens=16, max_actions=3, batch_size=4)
    expected = RolloutEngine(model, world_tokenizer, tiny_retriever, replace(base, greedy=True)).rollout(records)
    cold_cfg = replace(base, temperature=0.0)
    assert cold_cfg.decodes_greedily and not base.decodes_greedily
    cold = RolloutEngine(model, world_tokenizer, tiny_retriever, cold_cfg)
    for trajs in (cold.rollout(records, seed=5), cold.rollout(records, row_seeds=[1, 2, 3, 4])):
        assert [t.completion_ids for t in trajs] == [t.completion_ids for t in expected]
        assert all(math.isfinite(x) for t in trajs for x in t.logprobs)


@pytest.mark.parametrize("cls", [RolloutConfig, EvalRolloutConfig])
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("temperature", -1.0, "temperature must be a finite number >= 0 (0: greedy decoding), got -1.0"),
        ("temperature", math.nan, "temperature must be a finite number >= 0 (0: greedy decoding), got nan"),
        ("temperature", math.inf, "got inf"),
        ("top_p", 1.5, "top_p must be in (0, 1] (1.0: no nucleus cut), got 1.5"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("top_p", math.nan, "got nan"),
    ],
)
def test_rollout_configs_refuse_sampling_settings_out_of_range(cls: type, field: str, value: float, expected: str) -> None:
    with pytest.raises(ValueError) as e:
        cls(**{field: value})
    assert str(e.value).startswith(f"{cls.__name__}.{field}") and expected in str(e.value)


def test_the_bounds_themselves_are_accepted() -> None:
    assert RolloutConfig(temperature=0.0, top_p=1.0).decodes_greedily
    assert not RolloutConfig(temperature=1e-3, top_p=1e-3).decodes_greedily


def test_generators_and_the_llm_teacher_refuse_a_negative_temperature() -> None:
    with pytest.raises(ValueError, match=r"^temperature must be a finite number >= 0 \(0: greedy decoding\), got -0.5$"):
        Sampling(max_tokens=8, temperature=-0.5)
    assert Sampling(max_tokens=8, temperature=0.0).temperature == 0.0
    with pytest.raises(ValueError, match=r"^LLMTeacherConfig.temperature must be a finite number >= 0"):
        LLMTeacherConfig(base_url="http://127.0.0.1:9/v1", model="m", temperature=-1.0)


def test_the_checks_name_the_field_and_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"^X.t must be > 0 \(it must sample\), got 0$"):
        check_temperature(0, "X.t", needs_sampling="it must sample")
    check_temperature(0.7, "X.t", needs_sampling="it must sample")
    with pytest.raises(ValueError, match=r"^X.p must be in \(0, 1\]"):
        check_top_p(-0.1, "X.p")
    for bad in (0.0, -1e-5, math.nan, math.inf):
        with pytest.raises(ValueError, match=r"^X.lr must be a finite number > 0, got"):
            check_learning_rate(bad, "X.lr")
    check_learning_rate(0.0, "X.lr", zero_means="frozen")
    with pytest.raises(ValueError, match=r"^X.lr must be a finite number >= 0 \(0: frozen\), got -1"):
        check_learning_rate(-1, "X.lr", zero_means="frozen")
