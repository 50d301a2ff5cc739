"""The step-error counts on hand-written trajectories of a three-hop chain."""

from __future__ import annotations

from dataclasses import replace

from prorag.agent.schema import render_conclude, render_env_turn, render_search, step_opener
from prorag.evaluation.harness import summarise
from prorag.evaluation.step_errors import contains, step_error_counts, step_validity_fields
from tests.supervision.test_judge import CHAIN  # director of Saenax -> Siril, born in -> Tamal, country -> Krirek

DOCS = "Doc 1(Title: Saenax) Saenax was directed by Siril. Doc 2(Title: Orlin) Orlin was born in Saenax."


def then(action: str) -> str:
    """An action after an environment turn (which has already written the next ``<step>``)."""
    return action[len(step_opener()) :]


MISREAD = (  # the right search, then a sub-answer that is in no document though Siril was
    render_search("I need the director.", "Saenax director")
    + render_env_turn(DOCS)
    + then(render_conclude("Saenax was directed by Tamal.", "Tamal"))
    + render_env_turn()
    + " So the answer is Krirek. </step><answer> Krirek </answer>"
)
GOOD = (
    render_search("I need the director.", "Saenax director")
    + render_env_turn(DOCS)
    + then(render_conclude("Saenax was directed by Siril.", "Siril"))
    + render_env_turn()
    + " So the answer is Krirek. </step><answer> Krirek </answer>"
)


def test_a_reading_error_and_a_copy_are_told_apart() -> None:
    copied = (  # an off-target search, then a sub-answer copied from its documents, then a wrong answer
        render_search("Who is Orlin?", "Orlin birthplace")
        + render_env_turn(DOCS)
        + then(render_conclude("Orlin was born in Saenax.", "Orlin"))
        + render_env_turn()
        + " So the answer is Orlin. </step><answer> Orlin </answer>"
    )
    c = step_error_counts([(CHAIN, MISREAD), (CHAIN, copied), (CHAIN, GOOD)])
    assert c["trajectories"] == 3 and c["unpaired"] == 0
    assert (c["search"], c["search_valid"]) == (3, 2)
    assert (c["conclude"], c["conclude_valid"]) == (3, 1)
    # both wrong sub-answers followed documents holding Siril (hop 1's gold); only Orlin was copied
    assert c["conclude_wrong_gold_in_documents"] == 2
    assert c["conclude_wrong_copied_from_documents"] == 1
    # Krirek is right but never worked out (hop 3 unsearched): no valid answer; Orlin is wrong
    assert (c["answer"], c["answer_valid"]) == (3, 0)


def test_contains_normalises_and_never_matches_empty() -> None:
    assert contains("The director was SIRIL.", "siril")
    assert not contains("Saenax", "")
    assert not contains("Saenax", "Tamal")


def test_every_evaluation_line_counts_its_valid_steps_and_the_summary_pools_them() -> None:
    # misread: 1 search (valid), 1 sub-answer (invalid), 1 answer (not worked out);
    # good: 1 valid search, 1 valid sub-answer, 1 answer not worked out (hop 3 unsearched).
    misread, good = step_validity_fields(CHAIN, MISREAD), step_validity_fields(CHAIN, GOOD)
    assert misread == {
        "judged_searches": 1, "valid_searches": 1, "judged_subanswers": 1, "valid_subanswers": 0,
        "judged_answers": 1, "valid_answers": 0,
    }  # fmt: skip
    assert (good["valid_subanswers"], good["judged_subanswers"]) == (1, 1)
    # No gold decomposition (a benchmark without one), or text that is not the judged actions: no fields.
    assert step_validity_fields(replace(CHAIN, metadata={}), GOOD) == {}
    base = {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "substring_acc": 1.0, "format_valid": True, "retrieval_steps": 1}
    rows = [{**base, "stop_reason": "answer", **f} for f in (misread, good, {})]
    metrics = summarise(rows)
    assert metrics["valid_search_rate"] == 1.0  # 2 of 2 searches
    assert metrics["valid_subanswer_rate"] == 0.5  # 1 of 2 sub-answers
    assert metrics["valid_answer_rate"] == 0.0  # 0 of 2 answers
    assert summarise(rows[2:])["valid_search_rate"] is None  # no judged steps at all
