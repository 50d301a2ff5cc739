"""FLARE's control flow: a retrieval exactly when a look-ahead token's probability is below theta."""

from __future__ import annotations

import math

import pytest

from prorag.evaluation.eval_config import EvalConfig
from prorag.evaluation.flare import masked_query
from prorag.models.generator import Generation, ScriptedGenerator


def _look_ahead(words: list[str], probs: list[float], finish: str = "stop") -> Generation:
    tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
    return Generation("".join(tokens), [math.log(p) for p in probs], tokens, completion_tokens=len(tokens), finish_reason=finish)


def test_retrieves_and_regenerates_only_below_theta(retriever, two_records) -> None:  # noqa: ANN001
    def reply(prompt: str) -> str | Generation:
        if prompt.endswith("Answer: Alpha is old."):
            return _look_ahead(["So", "the", "answer", "is:", "Ann."], [0.9, 0.9, 0.9, 0.9, 0.41])
        if "about Alpha is old." in prompt:  # the regeneration after the masked query's search
            return "Alpha is old. And"
        return _look_ahead(["Alpha", "is", "very", "old."], [0.9, 0.9, 0.39, 0.95])

    gen = ScriptedGenerator(reply)
    cfg = EvalConfig(baseline="flare", baseline_options={"theta": 0.4})
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, two_records[:1], cfg))
    (t,) = batch
    # initial search with the question; one more with the masked look-ahead ("very" at 0.39 < 0.4);
    # the 0.41 token of the second sentence triggers nothing.
    assert [r["query"] for r in t.retrievals] == ["Who directed Alpha?", "Alpha is old."]
    assert t.text == "Alpha is old. So the answer is: Ann." and t.answer == "Ann" and t.stop_reason == "answer"
    assert [r["logprobs"] for r in gen.requests] == [True, False, True]


def test_no_retrieval_when_every_token_is_confident(retriever, two_records) -> None:  # noqa: ANN001
    gen = ScriptedGenerator(lambda p: _look_ahead(["Paris."], [0.5]))
    cfg = EvalConfig(baseline="flare", baseline_options={"theta": 0.4, "initial_retrieval": False})
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, two_records[1:], cfg))
    assert retriever.queries == [] and batch[0].answer == "Paris." and batch[0].stop_reason == "eos"


def test_needs_log_probabilities(retriever, two_records) -> None:  # noqa: ANN001
    cfg = EvalConfig(baseline="flare")
    with pytest.raises(ValueError, match="log-probabilities"):
        list(cfg.baseline_runner().run_generator(ScriptedGenerator(lambda p: "text."), retriever, two_records, cfg))


def test_masked_query() -> None:
    assert masked_query(["a", " b", " c"], [math.log(0.9), math.log(0.1), math.log(0.5)], 0.4, "fb") == "a c"
    assert masked_query(["a"], [math.log(0.1)], 0.4, "fb") == "fb"
