"""The outcome reward (Eq. 6) in the paper's and the reference code's forms, on hand-computed
values, read from the token ids (the trajectories' ``text`` has its tags stripped)."""

from __future__ import annotations

from typing import Any

import pytest

from prorag.method.rewards.outcome import (
    OutcomeRewardConfig,
    outcome_reward,
    outcome_rewards,
    outcome_value,
    trajectory_answer,
    trajectory_format_valid,
)

PAPER = OutcomeRewardConfig()
REFERENCE = OutcomeRewardConfig(form="reference")


def test_pure_formula_in_both_forms() -> None:
    # paper: F1 + nu2 * I_traj
    assert outcome_value(0.4, True, PAPER) == pytest.approx(1.4)
    assert outcome_value(0.4, False, PAPER) == pytest.approx(0.4)
    assert outcome_value(0.4, True, OutcomeRewardConfig(nu2=0.5)) == pytest.approx(0.9)
    # reference: (2 F1 if F1 >= 0.2 else 0) + (1 if I_traj else -1); 0.2 itself passes
    assert outcome_value(0.4, True, REFERENCE) == pytest.approx(1.8)
    assert outcome_value(0.2, True, REFERENCE) == pytest.approx(1.4)
    assert outcome_value(0.19, True, REFERENCE) == pytest.approx(1.0)
    assert outcome_value(1.0, False, REFERENCE) == pytest.approx(1.0)
    assert outcome_value(0.0, False, REFERENCE) == pytest.approx(-1.0)
    # nu2 belongs to the paper's form only
    assert outcome_value(0.4, True, OutcomeRewardConfig(form="reference", nu2=7.0)) == pytest.approx(1.8)
    with pytest.raises(ValueError, match="form"):
        OutcomeRewardConfig(form="other")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "final,golds,f1",
    [
        ("Paris", ["Paris"], 1.0),
        ("city of Paris", ["Paris France"], 0.4),  # P = 1/3, R = 1/2
        ("one two three four five six seven eight nine Paris", ["Paris"], 2 * 0.1 / 1.1),  # P = 1/10, R = 1
        ("Lyon", ["Paris"], 0.0),
        ("Paris", ["Lyon", "paris"], 1.0),  # best alias, normalised
    ],
)
def test_rewards_of_well_formed_trajectories(
    make_traj: Any, segments: Any, world_tokenizer: Any, final: str, golds: list[str], f1: float
) -> None:
    traj = make_traj(segments.valid(final))
    assert trajectory_answer(traj, world_tokenizer) == final
    assert trajectory_format_valid(traj, world_tokenizer)
    assert outcome_reward(traj, golds, world_tokenizer, PAPER) == pytest.approx(f1 + 1.0)
    expected_ref = (2 * f1 if f1 >= 0.2 else 0.0) + 1.0
    assert outcome_reward(traj, golds, world_tokenizer, REFERENCE) == pytest.approx(expected_ref)


def test_malformed_trajectories_get_the_format_penalty_without_crashing(
    make_traj: Any, segments: Any, world_tokenizer: Any
) -> None:
    tok = world_tokenizer
    # Cut mid-search by the token cap: no answer, invalid.
    cut = make_traj([("<step> I need the capital </step><subquery> capital of", True)], stop_reason="max_action_tokens")
    assert trajectory_answer(cut, tok) is None
    assert outcome_reward(cut, ["Paris"], tok, PAPER) == 0.0
    assert outcome_reward(cut, ["Paris"], tok, REFERENCE) == -1.0
    # Nothing at all.
    empty = make_traj([], stop_reason="eos")
    assert outcome_reward(empty, ["Paris"], tok, PAPER) == 0.0
    assert outcome_reward(empty, ["Paris"], tok, REFERENCE) == -1.0
    # A right answer in a malformed action (no </step>): F1 counts, the format does not.
    bad = make_traj([("<step> the answer <answer> Paris </answer>", True)])
    assert trajectory_answer(bad, tok) == "Paris" and not trajectory_format_valid(bad, tok)
    assert outcome_reward(bad, ["Paris"], tok, PAPER) == pytest.approx(1.0)
    assert outcome_reward(bad, ["Paris"], tok, REFERENCE) == pytest.approx(2.0 - 1.0)
    # A search whose retrieval never came (cut by the action cap) before an answer is invalid too.
    unretrieved = make_traj([segments.search, ("\n<step>", False), segments.answer("Paris")])
    assert not trajectory_format_valid(unretrieved, tok)
    # An otherwise valid trajectory cut by a cap is not well formed.
    capped = make_traj(segments.valid("Paris"), stop_reason="max_completion_tokens")
    assert outcome_reward(capped, ["Paris"], tok, PAPER) == pytest.approx(1.0)


def test_a_trailing_eos_is_the_end_not_stray_text(make_traj: Any, segments: Any, world_tokenizer: Any) -> None:
    traj = make_traj(segments.valid("Paris"), stop_reason="eos", extra_ids=[world_tokenizer.eos_token_id])
    assert trajectory_format_valid(traj, world_tokenizer)
    assert outcome_reward(traj, ["Paris"], world_tokenizer) == pytest.approx(2.0)


def test_reads_the_ids_not_the_stripped_text(make_traj: Any, segments: Any, world_tokenizer: Any) -> None:
    traj = make_traj(segments.valid("Paris"))
    assert "<answer>" not in traj.text and traj.answer is None and not traj.valid  # what a text reader would see
    assert outcome_reward(traj, ["Paris"], world_tokenizer) == pytest.approx(2.0)
    # And the other way round: a well-formed text over malformed ids scores as the ids say.
    bad = make_traj([("<step> the answer <answer> Paris </answer>", True)])
    bad.text, bad.answer, bad.valid = make_traj(segments.valid("Lyon")).text, "Lyon", True
    assert outcome_reward(bad, ["Paris"], world_tokenizer, REFERENCE) == pytest.approx(1.0)


def test_strict_grammar_is_the_reference_default(make_traj: Any, segments: Any, world_tokenizer: Any) -> None:
    # Two searches in a row: the project's grammar allows it, the reference code's (S Q R S A)* S F does not.
    again = (" search once more </step><subquery> France capital city </subquery>", True)
    twice = make_traj([segments.search, segments.retrieval, again, segments.retrieval, segments.answer("Paris")])
    assert trajectory_format_valid(twice, world_tokenizer)
    assert not trajectory_format_valid(twice, world_tokenizer, strict=True)
    assert outcome_reward(twice, ["Paris"], world_tokenizer, PAPER) == pytest.approx(2.0)
    assert outcome_reward(twice, ["Paris"], world_tokenizer, REFERENCE) == pytest.approx(2.0 - 1.0)
    relaxed_reference = OutcomeRewardConfig(form="reference", strict_grammar=False)
    assert outcome_reward(twice, ["Paris"], world_tokenizer, relaxed_reference) == pytest.approx(3.0)
    # A direct answer, S F, is valid in both.
    direct = make_traj([("<step> I know it </step><answer> Paris </answer>", True)])
    assert outcome_reward(direct, ["Paris"], world_tokenizer, REFERENCE) == pytest.approx(3.0)


def test_batch_helper_matches_and_checks_lengths(make_traj: Any, segments: Any, world_tokenizer: Any) -> None:
    trajs = [make_traj(segments.valid("Paris")), make_traj(segments.valid("Lyon"))]
    assert outcome_rewards(trajs, [["Paris"], ["Paris"]], world_tokenizer) == pytest.approx([2.0, 1.0])
    with pytest.raises(ValueError, match="gold"):
        outcome_rewards(trajs, [["Paris"]], world_tokenizer)


def test_a_tag_spelled_out_of_plain_tokens_is_no_tag(make_traj: Any, segments: Any, world_tokenizer: Any) -> None:
    """A real tokenizer (SmolLM2's, and the world's) can also write ``<answer>`` as ``<``, ``answer``,
    ``>``: the same decoded text as the tag token, but the engine and the token parser saw no tag, so
    the trajectory has no answer and no I_traj (a policy must not earn the format bonus that way)."""
    from dataclasses import replace

    tok = world_tokenizer
    traj = make_traj(segments.valid("Paris"))
    ids = list(traj.completion_ids)
    at = len(ids) - 1 - ids[::-1].index(tok.convert_tokens_to_ids("<answer>"))
    spelled = [t for piece in ("<", "answer", ">") for t in tok.encode(piece, add_special_tokens=False)]
    fake = replace(traj, completion_ids=ids[:at] + spelled + ids[at + 1 :])
    assert tok.decode(fake.completion_ids, skip_special_tokens=False) == tok.decode(ids, skip_special_tokens=False)
    assert trajectory_answer(traj, tok) == "Paris" and trajectory_format_valid(traj, tok)
    assert trajectory_answer(fake, tok) is None and not trajectory_format_valid(fake, tok)
    assert outcome_reward(fake, ["Paris"], tok) == pytest.approx(0.0)
