"""Search-o1's control flow: the model's own queries, Reason-in-Documents, limits, the boxed answer."""

from __future__ import annotations

from prorag.evaluation.eval_config import EvalConfig
from prorag.evaluation.search_o1 import BEGIN_QUERY, BEGIN_RESULT, END_QUERY, END_RESULT, REASON_IN_DOCUMENTS
from prorag.models.generator import ScriptedGenerator


def _reply(prompt: str) -> str:
    if REASON_IN_DOCUMENTS[:40] in prompt:
        return "notes **Final Information** Alpha was directed by Ann Lee."
    if "Alpha was directed by Ann Lee." in prompt:  # the condensed result is in: answer
        return "So it is \\boxed{Ann Lee}."
    return f"I should search. {BEGIN_QUERY} Alpha director {END_QUERY} ignored"


def test_search_condense_insert_answer(retriever, two_records) -> None:  # noqa: ANN001
    gen = ScriptedGenerator(_reply)
    cfg = EvalConfig(baseline="search-o1")
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, two_records[:1], cfg))
    (t,) = batch
    assert retriever.queries == ["Alpha director"] and t.num_searches == 1
    assert gen.requests[0]["stop"] == [END_QUERY] and gen.requests[0]["n"] == 1
    condense = gen.calls[1]
    assert "Current search query: Alpha director" in condense and "about Alpha director" in condense
    inserted = f"{END_QUERY}\n\n{BEGIN_RESULT}\nAlpha was directed by Ann Lee.\n{END_RESULT}\n\n"
    assert inserted in gen.calls[2] and len(gen.calls) == 3
    assert t.answer == "Ann Lee" and t.stop_reason == "answer" and t.metadata["generations"] == 3


def test_repeated_query_and_search_limit(retriever, two_records) -> None:  # noqa: ANN001
    gen = ScriptedGenerator(lambda p: "notes" if REASON_IN_DOCUMENTS[:40] in p else f"{BEGIN_QUERY} same {END_QUERY}")
    cfg = EvalConfig(baseline="search-o1", baseline_options={"max_turns": 3})
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, two_records[:1], cfg))
    (t,) = batch
    assert retriever.queries == ["same"] and t.stop_reason == "max_turns"
    assert "You have searched this query" in t.text
    gen = ScriptedGenerator(
        lambda p: "notes" if REASON_IN_DOCUMENTS[:40] in p else f"{BEGIN_QUERY} q{p.count(BEGIN_RESULT)} {END_QUERY}"
    )
    cfg = EvalConfig(baseline="search-o1", baseline_options={"max_turns": 4, "max_searches": 2})
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, two_records[:1], cfg))
    assert batch[0].num_searches == 2 and "maximum search limit is exceeded" in batch[0].text
