"""Iter-RetGen's control flow on scripted generations."""

from __future__ import annotations

from prorag.evaluation.eval_config import EvalConfig, EvalRolloutConfig
from prorag.evaluation.iter_retgen import IterRetGen
from prorag.models.generator import ScriptedGenerator


def test_each_round_searches_with_question_plus_previous_generation(retriever, two_records) -> None:  # noqa: ANN001
    rounds = {"q": 0}

    def reply(prompt: str) -> str:
        rounds["q"] += 1
        return f"guess {rounds['q']} so the answer is: A{rounds['q']}."

    gen = ScriptedGenerator(reply)
    cfg = EvalConfig(baseline="iter-retgen", rollout=EvalRolloutConfig(top_k=2, batch_size=1))
    runner = cfg.baseline_runner()
    (t,) = next(runner.run_generator(gen, retriever, two_records[:1], cfg))
    q = "Who directed Alpha?"
    assert retriever.queries == [q, f"{q} guess 1 so the answer is: A1.", f"{q} guess 2 so the answer is: A2."]
    assert len(gen.calls) == 3 and "about " + retriever.queries[2] in gen.calls[2]  # round 3 reads round 3's documents
    assert t.answer == "A3" and t.stop_reason == "rounds" and t.num_searches == 3
    assert [r["action"] for r in t.retrievals] == [0, 1, 2] and t.retrievals[0]["doc_ids"] == [f"{q}#0", f"{q}#1"]
    assert t.metadata["completion_tokens"] == 3 * 7  # seven words a reply
    assert t.metadata["prompt_tokens"] == sum(len(p.split()) for p in gen.calls)


def test_rounds_is_an_option(retriever, two_records) -> None:  # noqa: ANN001
    gen = ScriptedGenerator(lambda p: "x")
    runner = IterRetGen({"rounds": 1})
    cfg = EvalConfig(baseline="iter-retgen")
    batches = list(runner.run_generator(gen, retriever, two_records, cfg))
    assert retriever.queries == [r.question for r in two_records] and len(gen.calls) == 2
    assert len(gen.requests) == 1, "the questions of a batch share one generate call"
    assert [t.answer for b in batches for t in b] == ["x", "x"]
