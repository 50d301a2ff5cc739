"""The context budget: the maximum length read from the policy, the room a prompt must leave, the
skip and cut rules, and the samplers' counted skip."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from prorag.agent.context_budget import (
    ContextBudget,
    apply_budget,
    context_budget,
    cut_question,
    drop_over_long,
    policy_max_length,
)
from prorag.agent.prompts import prompt_token_ids
from prorag.agent.rollout_config import RolloutConfig
from prorag.data.records import Record

SHORT = "Are Tamal and the home city of Brisak in the same country?"


def long_question(times: int = 40) -> str:
    return " ".join(f"Who founded the home city of Brisak {i}?" for i in range(times))


def test_max_length_from_the_config_else_a_real_tokenizer_bound() -> None:
    tokenizer = SimpleNamespace(model_max_length=512)
    assert policy_max_length(SimpleNamespace(config=SimpleNamespace(max_position_embeddings=96)), tokenizer) == 96
    assert policy_max_length(SimpleNamespace(), tokenizer) == 512  # a stand-in model without a config
    assert policy_max_length(SimpleNamespace(), SimpleNamespace(model_max_length=int(1e30))) is None  # transformers' "unknown"
    config = RolloutConfig(max_action_tokens=16, max_completion_tokens=8)
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=96))
    assert context_budget(model, tokenizer, config) == ContextBudget(96, 8)  # the room is at most the completion cap
    assert context_budget(SimpleNamespace(), SimpleNamespace(), config) is None


def test_short_questions_pass_untouched_and_an_over_long_one_is_skipped_or_cut(world_tokenizer: Any) -> None:
    records = [Record("a", SHORT, ["x"]), Record("long", long_question(), ["y"]), Record("b", SHORT + " Yes?", ["z"])]
    budget = ContextBudget(max_length=64, room=8)
    assert len(prompt_token_ids(world_tokenizer, records[1].question)) > budget.prompt_limit

    skip = apply_budget(records, world_tokenizer, budget, "skip")
    assert [r.id for r in skip.rollout] == ["a", "b"] and skip.rollout[0] is records[0]
    assert [r.id for r in skip.skipped] == ["long"] and not skip.cut

    cut = apply_budget(records, world_tokenizer, budget, "cut")
    assert [r.id for r in cut.rollout] == ["a", "long", "b"] and cut.cut == {"long"} and not cut.skipped
    kept = cut.rollout[1]
    assert kept.golden_answers == ["y"] and records[1].question.endswith(kept.question)  # the end is kept
    assert len(prompt_token_ids(world_tokenizer, kept.question)) <= budget.prompt_limit
    # As long as fits: one more token of the question would not.
    ids = world_tokenizer(records[1].question, add_special_tokens=False)["input_ids"]
    longer = world_tokenizer.decode(ids[-(len(world_tokenizer(kept.question)["input_ids"]) + 2) :], skip_special_tokens=True)
    assert len(prompt_token_ids(world_tokenizer, longer)) > budget.prompt_limit

    # No budget known: everything is rolled out as it is.
    assert apply_budget(records, world_tokenizer, None, "skip").rollout == records


def test_a_question_that_cannot_fit_even_empty_is_skipped_by_the_cut_rule(world_tokenizer: Any) -> None:
    template = len(prompt_token_ids(world_tokenizer, ""))
    assert cut_question(world_tokenizer, long_question(), template) is None
    split = apply_budget([Record("long", long_question(), ["y"])], world_tokenizer, ContextBudget(template + 4, 4), "cut")
    assert [r.id for r in split.skipped] == ["long"] and not split.rollout
    with pytest.raises(ValueError, match="over_long must be one of"):
        apply_budget([], world_tokenizer, None, "truncate")  # type: ignore[arg-type]


def test_the_samplers_drop_over_long_questions_with_a_counted_warning(
    world_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    records = [Record("a", SHORT, ["x"]), Record("long", long_question(), ["y"])]
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    config = RolloutConfig(max_action_tokens=8, max_completion_tokens=24)
    with caplog.at_level(logging.WARNING, logger="prorag.agent.context_budget"):
        kept = drop_over_long(records, model, world_tokenizer, config, "RFT sampling")
    assert [r.id for r in kept] == ["a"]
    assert "RFT sampling: 1 of 2 questions over the context budget" in caplog.text and "1 skipped, 0 cut" in caplog.text
    caplog.clear()
    assert drop_over_long(records[:1], model, world_tokenizer, config, "RFT sampling") == records[:1]
    assert not caplog.text  # nothing to say when everything fits
