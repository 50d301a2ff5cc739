"""The step-error counts on hand-written trajectories of a three-hop chain."""

from __future__ import annotations

from prorag.agent.schema import render_conclude, render_env_turn, render_search, step_opener
from prorag.evaluation.step_errors import contains, step_error_counts
from tests.supervision.test_judge import CHAIN  # director of Saenax -> Siril, born in -> Tamal, country -> Krirek

DOCS = "Doc 1(Title: Saenax) Saenax was directed by Siril. Doc 2(Title: Orlin) Orlin was born in Saenax."


def then(action: str) -> str:
    """An action after an environment turn (which has already written the next ``<step>``)."""
    return action[len(step_opener()) :]


def test_a_reading_error_and_a_copy_are_told_apart() -> None:
    misread = (  # the right search, then a sub-answer that is in no document though Siril was
        render_search("I need the director.", "Saenax director")
        + render_env_turn(DOCS)
        + then(render_conclude("Saenax was directed by Tamal.", "Tamal"))
        + render_env_turn()
        + " So the answer is Krirek. </step><answer> Krirek </answer>"
    )
    copied = (  # an off-target search, then a sub-answer copied from its documents, then a wrong answer
        render_search("Who is Orlin?", "Orlin birthplace")
        + render_env_turn(DOCS)
        + then(render_conclude("Orlin was born in Saenax.", "Orlin"))
        + render_env_turn()
        + " So the answer is Orlin. </step><answer> Orlin </answer>"
    )
    good = (
        render_search("I need the director.", "Saenax director")
        + render_env_turn(DOCS)
        + then(render_conclude("Saenax was directed by Siril.", "Siril"))
        + render_env_turn()
        + " So the answer is Krirek. </step><answer> Krirek </answer>"
    )
    c = step_error_counts([(CHAIN, misread), (CHAIN, copied), (CHAIN, good)])
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
