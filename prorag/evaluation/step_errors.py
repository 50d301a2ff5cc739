"""Where a policy's steps go wrong: the oracle's verdict on every step, counted by kind.

Exact match says how often a policy is right, not why it is wrong. On questions with gold
decompositions (the built-in world, MuSiQue) every action of a trajectory is judged by the oracle
after the actions before it (:func:`~prorag.supervision.judge.trajectory_verdicts`, the rule behind
the MCTS pairs and the ``oracle`` step rewards), and the counts (:func:`step_error_counts`) separate
a searching error from a reading error. ``research/drivers/step_errors.py`` prints them for the systems of
a run folder. Every evaluation counts searches, sub-answers and final answers per question
(:func:`step_validity_fields`, on its prediction lines) and reports their rates
(:data:`STEP_VALIDITY_RATES`, in ``metrics.json``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from prorag.agent.schema import parse_trajectory
from prorag.core.metrics import normalize_answer
from prorag.data.records import Record
from prorag.supervision.judge import trajectory_verdicts


def contains(haystack: str, needle: str) -> bool:
    """Whether ``needle`` occurs in ``haystack`` once both are normalised (an empty needle never does)."""
    n = normalize_answer(needle)
    return bool(n) and n in normalize_answer(haystack)


def step_error_counts(trajectories: Iterable[tuple[Record, str]]) -> Counter[str]:
    """The counts over ``(record, trajectory text with tags)`` pairs:

    * ``search`` / ``search_valid``: sub-queries, and those that target an open hop;
    * ``conclude`` / ``conclude_valid``: sub-answers, and those that are a supported, correct sub-answer;
      of the wrong ones, ``conclude_wrong_gold_in_documents`` were written right after reading
      documents that held a gold sub-answer of the question (the evidence was there: a reading
      error) and ``conclude_wrong_copied_from_documents`` copied another span of those documents;
    * ``answer`` / ``answer_valid``: final answers, and those right and worked out (not guessed);
    * ``malformed``: actions with no kind; ``unpaired``: trajectories whose text parses into other
      actions than the verdicts (left out of the step counts); ``trajectories``: all of them."""
    c: Counter[str] = Counter()
    for record, text in trajectories:
        actions = parse_trajectory(text).actions
        verdicts = trajectory_verdicts(record, text)
        c["trajectories"] += 1
        if len(verdicts) != len(actions):
            c["unpaired"] += 1
            continue
        golds = [hop["answer"] for hop in record.metadata.get("decomposition") or []]
        documents = ""
        for action, (valid, _) in zip(actions, verdicts, strict=True):
            kind = action.kind.value if action.kind is not None else "malformed"
            c[kind] += 1
            c[f"{kind}_valid"] += int(valid)
            if kind == "search":
                documents = action.retrieval or ""
            elif kind == "conclude" and not valid:
                c["conclude_wrong_gold_in_documents"] += int(any(contains(documents, g) for g in golds))
                c["conclude_wrong_copied_from_documents"] += int(contains(documents, action.content))
    return c


#: Per kind of action: the prediction-line fields :func:`step_validity_fields` writes (valid, judged)
#: and the rate ``metrics.json`` reports (valid / judged, pooled over the questions' steps).
STEP_VALIDITY_RATES: dict[str, tuple[str, str]] = {
    "valid_search_rate": ("valid_searches", "judged_searches"),
    "valid_subanswer_rate": ("valid_subanswers", "judged_subanswers"),
    "valid_answer_rate": ("valid_answers", "judged_answers"),
}
_KINDS = {"search": "searches", "conclude": "subanswers", "answer": "answers"}


def step_validity_fields(record: Record, text: str) -> dict[str, int]:
    """The oracle's verdicts on one trajectory's actions, counted per kind for its prediction line:
    ``judged_searches`` / ``valid_searches`` (sub-queries that target an open hop), the same for
    sub-answers (supported and correct) and final answers (right and worked out). ``{}`` where the
    record has no gold decomposition or the text does not parse into the judged actions.

    The choice made: EM says whether a policy ended right, these say whether its steps were, which
    is what step rewards are meant to change, and what they can change while EM stays where it was."""
    if not record.metadata.get("decomposition"):
        return {}
    c = step_error_counts([(record, text)])
    if c["unpaired"]:
        return {}
    return {
        f"{prefix}_{name}": c[kind + suffix]
        for kind, name in _KINDS.items()
        for prefix, suffix in (("judged", ""), ("valid", "_valid"))
    }
