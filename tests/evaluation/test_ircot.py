"""IRCoT's control flow on scripted generations."""

from __future__ import annotations

from prorag.evaluation.eval_config import EvalConfig
from prorag.models.generator import ScriptedGenerator


def _run(retriever, records, replies, **options):  # noqa: ANN001, ANN202
    gen = ScriptedGenerator(replies)
    cfg = EvalConfig(baseline="ircot", baseline_options=options)
    (batch,) = list(cfg.baseline_runner().run_generator(gen, retriever, records, cfg))
    return gen, batch


def test_one_sentence_then_a_search_with_it_until_the_answer(retriever, two_records) -> None:  # noqa: ANN001
    def reply(prompt: str) -> str:
        if "Beta born" in prompt:
            return "Beta is French. More text.\nignored"
        return "So the answer is: Ann Lee." if "Alpha was made by Ann" in prompt else "Alpha was made by Ann Lee. Then more."

    gen, (t1, t2) = _run(retriever, two_records, reply, max_steps=3)
    # q1: search(question), sentence 1, search(sentence 1), answer sentence -> stop (no third search).
    assert [r["query"] for r in t1.retrievals] == ["Who directed Alpha?", "Alpha was made by Ann Lee."]
    assert t1.answer == "Ann Lee" and t1.stop_reason == "answer"
    assert t1.text == "Alpha was made by Ann Lee. So the answer is: Ann Lee."
    # q2 never says "answer is": 3 sentences, a search after each but the last, then the reader.
    assert [r["query"] for r in t2.retrievals] == ["Where was Beta born?", "Beta is French.", "Beta is French."]
    assert t2.stop_reason == "max_steps" and gen.calls[-1].endswith("So the answer is:")
    assert t2.answer == "Beta is French" and t2.metadata["generations"] == 4
    assert all(r["stop"] == ["\n"] for r in gen.requests)


def test_documents_accumulate_without_duplicates_up_to_the_cap(retriever, two_records) -> None:  # noqa: ANN001
    gen, (t,) = _run(retriever, two_records[:1], lambda p: "Same thought.", max_steps=3, max_docs=4)
    last = gen.calls[-1]
    assert last.count("Doc ") == 4 and "Doc 5" not in last
