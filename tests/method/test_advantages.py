"""Group-relative advantages on hand-computed tensors: GRPO, ProRAG's dual granularity with the
paper's step normalisation and the reference code's token normalisation, beta = 0, masking of
environment tokens, groups whose rows are interleaved, CPGRPO."""

from __future__ import annotations

import math

import pytest
import torch

from prorag.method.advantages import (
    advantage_composition,
    agreeing_group_share,
    agreeing_rows,
    broadcast_to_tokens,
    cpgrpo_advantages,
    disagreeing_groups,
    dual_granularity_advantages,
    group_normalize,
    grpo_advantages,
    process_advantages,
    scale_name,
    sign_bounded,
)


def test_grpo_standardises_within_each_group_with_the_sample_std() -> None:
    # Group 0: [1, 2, 3] -> mean 2, sample std 1 -> [-1, 0, 1]. Group 1: [5, 5] -> all agree -> 0.
    # The rows of the two groups are interleaved.
    outcome = torch.tensor([1.0, 5.0, 2.0, 5.0, 3.0])
    groups = torch.tensor([0, 1, 0, 1, 0])
    adv = grpo_advantages(outcome, groups, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 0.0, 0.0, 1.0]))
    # Relabelling the groups (any integers) changes nothing; eps only shrinks the scale.
    assert torch.allclose(grpo_advantages(outcome, torch.tensor([7, -3, 7, -3, 7]), eps=0.0), adv)
    assert torch.allclose(grpo_advantages(outcome, groups), adv / (1 + 1e-6))
    # Without scaling (Dr. GRPO) only the mean is subtracted.
    assert torch.allclose(grpo_advantages(outcome, groups, scale=False), torch.tensor([-1.0, 0.0, 0.0, 0.0, 1.0]))
    assert torch.allclose(grpo_advantages(outcome * 3, groups, scale=False), torch.tensor([-3.0, 0.0, 0.0, 0.0, 3.0]))


def test_batch_scale_divides_every_group_by_one_std_of_the_batch() -> None:
    # Group 0: one right answer of four, [1, 0, 0, 0]; group 1: four wrong answers, one with a
    # format bonus of 0.2, [0.2, 0, 0, 0]. Centred: [0.75, -0.25 x3] and [0.15, -0.05 x3].
    # Batch mean 1.2 / 8 = 0.15; squared deviations 0.85^2 + 3 * 0.15^2 + 0.05^2 + 3 * 0.15^2
    # = 0.86, unbiased variance 0.86 / 7, std 0.350510.
    values = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    spread = math.sqrt(0.86 / 7)
    centred = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.15, -0.05, -0.05, -0.05])
    assert torch.allclose(group_normalize(values, groups, scale="batch", eps=0.0), centred / spread)
    # Each group's own std gives both groups the same push ([1.5, -0.5 x3]); the batch's keeps
    # their proportion (5 : 1), as no scaling does.
    by_group = group_normalize(values, groups, scale="group", eps=0.0)
    assert torch.allclose(by_group[:4], by_group[4:])
    by_batch = group_normalize(values, groups, scale="batch", eps=0.0)
    assert torch.allclose(by_batch[:4], 5 * by_batch[4:])
    # True and False are the group and no scaling; a batch whose values all agree is all 0.
    assert torch.equal(group_normalize(values, groups, scale=True, eps=0.0), by_group)
    assert torch.equal(group_normalize(values, groups, scale=False), group_normalize(values, groups, scale="none"))
    assert torch.equal(group_normalize(torch.full((8,), 0.2), groups, scale="batch"), torch.zeros(8))


def test_scale_names_refuse_an_unknown_divisor() -> None:
    assert [scale_name(s) for s in (True, False, "group", "batch", "none")] == ["group", "none", "group", "batch", "none"]
    with pytest.raises(ValueError, match="scale must be"):
        group_normalize(torch.ones(2), torch.zeros(2, dtype=torch.long), scale="global")


def test_a_group_of_one_gets_zero_not_nan() -> None:
    adv = grpo_advantages(torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1]), eps=0.0)
    assert adv[0] == 0.0 and not torch.isnan(adv).any()


def test_frequency_weights_equal_repeating_the_values() -> None:
    values, weights = torch.tensor([1.0, 3.0, 2.0]), torch.tensor([2.0, 1.0, 3.0])
    repeated = torch.tensor([1.0, 1.0, 3.0, 2.0, 2.0, 2.0])
    expected = (repeated - repeated.mean()) / repeated.std()
    got = group_normalize(values, torch.zeros(3, dtype=torch.long), weights, eps=0.0)
    assert torch.allclose(got, expected[[0, 2, 3]])


# A batch of four completions (T = 6) in two groups, rows interleaved: A and B form group 0,
# C and D group 1. Loss masks: 0 on environment tokens (A's 2, 3; a retrieval) and on padding.
#   A: outcome 1, steps rewards [1, 3] over spans (0, 2) and (4, 5)
#   C: outcome 5, one step reward 7 over (0, 1)
#   B: outcome 0, one step reward 2 over (0, 3)
#   D: outcome 5, no step (a generated token outside every step gets its outcome advantage)
OUTCOME = torch.tensor([1.0, 5.0, 0.0, 5.0])
GROUPS = torch.tensor([0, 1, 0, 1])
STEP_REWARDS = [torch.tensor([1.0, 3.0]), torch.tensor([7.0]), torch.tensor([2.0]), torch.tensor([])]
SPANS = [[(0, 2), (4, 5)], [(0, 1)], [(0, 3)], []]
MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
    ]
)
# Group 0's outcomes [1, 0]: mean 1/2, sample std sqrt(1/2). Group 1's [5, 5]: advantage 0.
A_OUT = [1 / math.sqrt(2), 0.0, -1 / math.sqrt(2), 0.0]


def _expected(beta: float, a_proc: dict[tuple[int, int], float]) -> torch.Tensor:
    """Token advantages from A_OUT and the process advantage of (row, step)."""
    out = torch.zeros(4, 6)
    out[0, 0:2] = A_OUT[0] + beta * a_proc[0, 0]
    out[0, 4] = A_OUT[0] + beta * a_proc[0, 1]
    out[1, 0] = A_OUT[1] + beta * a_proc[1, 0]
    out[2, 0:3] = A_OUT[2] + beta * a_proc[2, 0]
    out[3, 0:2] = A_OUT[3]
    return out


def test_dual_granularity_with_the_papers_step_normalisation() -> None:
    # Group 0's steps [1, 3, 2]: mean 2, sample std 1 -> A_proc [-1, 1, 0]; group 1's single step -> 0.
    a_proc = {(0, 0): -1.0, (0, 1): 1.0, (2, 0): 0.0, (1, 0): 0.0}
    got = dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.5, process_norm="step", eps=0.0)
    assert torch.allclose(got, _expected(0.5, a_proc), atol=1e-6)
    # e.g. A's first step: 1/sqrt(2) - 0.5 = 0.2071...
    assert got[0, 0].item() == pytest.approx(0.20710678, abs=1e-6)


def test_dual_granularity_with_the_reference_codes_token_normalisation() -> None:
    # Group 0's generated step tokens carry [1, 1 | 3 | 2, 2, 2] (A's first step has 2 tokens, its
    # second 1, B's step 3): mean 11/6, sample std over the 6 tokens.
    tokens = [1.0, 1.0, 3.0, 2.0, 2.0, 2.0]
    mean = sum(tokens) / 6
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 5)
    a_proc = {(0, 0): (1 - mean) / std, (0, 1): (3 - mean) / std, (2, 0): (2 - mean) / std, (1, 0): 0.0}
    got = dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.5, process_norm="token", eps=0.0)
    assert torch.allclose(got, _expected(0.5, a_proc), atol=1e-6)
    # The two norms differ: the long step of B (3 tokens) pulls the token mean towards 2.
    step = dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.5, process_norm="step", eps=0.0)
    assert not torch.allclose(got, step)


def test_beta_zero_equals_plain_grpo_on_every_generated_token() -> None:
    gen = torch.Generator().manual_seed(0)
    B, T = 8, 12
    outcome = torch.rand(B, generator=gen)
    groups = torch.tensor([0, 1, 2, 3] * 2)  # 4 groups of 2, interleaved
    mask = (torch.rand(B, T, generator=gen) > 0.3).long()
    spans = [[(0, 4), (4, 9)], [(1, 12)]] * 4
    rewards = [torch.randn(len(s), generator=gen) * 5 for s in spans]
    for norm in ("step", "token"):
        got = dual_granularity_advantages(outcome, rewards, spans, mask, groups, beta=0.0, process_norm=norm)
        expected = grpo_advantages(outcome, groups)[:, None].expand(B, T) * mask
        assert torch.equal(got, expected)


def test_environment_tokens_and_padding_never_get_an_advantage() -> None:
    # A span that claims environment tokens and padding (a malformed parse) still gives them 0.
    spans = [[(0, 6)], [(0, 6)], [(0, 6)], [(0, 6)]]
    rewards = [torch.tensor([10.0]), torch.tensor([-3.0]), torch.tensor([-10.0]), torch.tensor([4.0])]
    for norm in ("step", "token"):
        got = dual_granularity_advantages(OUTCOME, rewards, spans, MASK, GROUPS, beta=1.0, process_norm=norm)
        assert (got[MASK == 0] == 0).all()
        assert (got[MASK == 1] != 0).any()


def test_groups_are_gathered_wherever_their_rows_sit() -> None:
    # The same batch in another row order gives the same advantages, row for row.
    order = torch.tensor([3, 0, 2, 1])
    base = dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.3)
    permuted = dual_granularity_advantages(
        OUTCOME[order],
        [STEP_REWARDS[i] for i in order],
        [SPANS[i] for i in order],
        MASK[order],
        GROUPS[order],
        beta=0.3,
    )
    assert torch.allclose(permuted, base[order])
    # And a group's statistics ignore the other groups' values entirely.
    other = OUTCOME.clone()
    other[[1, 3]] = torch.tensor([100.0, -100.0])
    changed = dual_granularity_advantages(other, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.3)
    assert torch.allclose(changed[[0, 2]], base[[0, 2]])


def test_process_advantages_need_lengths_for_the_token_norm() -> None:
    with pytest.raises(ValueError, match="step_lengths"):
        process_advantages(STEP_REWARDS, GROUPS, None, "token")
    with pytest.raises(ValueError, match="process_norm"):
        process_advantages(STEP_REWARDS, GROUPS, None, "tokens")  # type: ignore[arg-type]


def test_broadcast_cuts_spans_at_the_width_and_checks_counts() -> None:
    out = broadcast_to_tokens(torch.tensor([1.0]), [torch.tensor([2.0])], [[(3, 99)]], torch.ones(1, 5))
    assert out.tolist() == [[1.0, 1.0, 1.0, 2.0, 2.0]]
    with pytest.raises(ValueError, match="step values"):
        broadcast_to_tokens(torch.tensor([1.0]), [torch.tensor([2.0, 3.0])], [[(0, 1)]], torch.ones(1, 5))


def test_cpgrpo_takes_the_magnitude_from_the_advantage_and_the_sign_from_the_process_reward() -> None:
    adv = torch.tensor([-2.0, 0.5])
    pr = torch.tensor([[1.2, -0.3, 0.0], [-1.0, 1.0, 1.0]])
    assert torch.allclose(cpgrpo_advantages(adv, pr), torch.tensor([[2.4, -0.6, 0.0], [-0.5, 0.5, 0.5]]))


def test_a_group_of_equal_rewards_gets_exactly_zero_despite_float_rounding() -> None:
    # Eight copies of 0.2 (a wrong, well-formed answer at nu2 = 0.2) have a float32 std of 1.6e-8;
    # divided by (std + 1e-6) that was an advantage of -0.015 on every row. A second group varies.
    values = torch.tensor([0.2] * 8 + [0.0, 1.2], dtype=torch.float32)
    groups = torch.tensor([0] * 8 + [1, 1])
    out = group_normalize(values, groups)
    assert torch.equal(out[:8], torch.zeros(8))
    # the varying group: mean 0.6, std sqrt(0.72) = 0.848528 -> -/+ 0.6 / (0.848528 + 1e-6)
    assert out[8:].tolist() == pytest.approx([-0.707106, 0.707106], abs=1e-5)
    weighted = group_normalize(values, groups, torch.tensor([3.0] * 8 + [1.0, 1.0]))
    assert torch.equal(weighted[:8], torch.zeros(8))


def test_agreeing_group_share_counts_groups_with_nothing_to_compare() -> None:
    # Groups (non-contiguous ids): 7 -> all 0.2, 3 -> 1 and 0, 5 -> all 1.0, 9 -> one row.
    values = torch.tensor([0.2, 1.0, 0.2, 0.0, 1.0, 1.0, 0.2, 0.5])
    groups = torch.tensor([7, 3, 7, 3, 5, 5, 7, 9])
    # agreeing: 7, 5 and the one-row group 9; not 3 -> 3 of 4
    assert agreeing_group_share(values, groups) == pytest.approx(0.75)
    # exact match of the same rows: every group agrees but group 3
    em = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    assert agreeing_group_share(em, groups) == pytest.approx(0.75)
    assert agreeing_group_share(torch.tensor([0.0, 1.0]), torch.tensor([0, 0])) == 0.0
    assert agreeing_group_share(torch.tensor([]), torch.tensor([], dtype=torch.long)) == 0.0
    with pytest.raises(ValueError, match="must be equal 1-D shapes"):
        agreeing_group_share(values, groups[:3])


def test_disagreeing_groups_are_the_groups_with_an_outcome_signal() -> None:
    # Same rows as above: only group 3 (values 1.0 and 0.0) disagrees; a one-row group agrees.
    values = torch.tensor([0.2, 1.0, 0.2, 0.0, 1.0, 1.0, 0.2, 0.5])
    groups = torch.tensor([7, 3, 7, 3, 5, 5, 7, 9])
    assert disagreeing_groups(values, groups) == [3]
    # Two disagreeing groups come back ascending, whatever the row order.
    em = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert disagreeing_groups(em, torch.tensor([8, 2, 8, 2, 4, 4])) == [2, 8]
    assert disagreeing_groups(torch.tensor([]), torch.tensor([], dtype=torch.long)) == []
    with pytest.raises(ValueError, match="must be equal 1-D shapes"):
        disagreeing_groups(values, groups[:3])


def test_advantage_composition_by_hand() -> None:
    # Group 0 (rows 0, 1): outcomes 1 and 0 -> A_out = +-0.5 / std 0.707107 = +-a, a = 0.707107.
    # Group 1 (rows 2, 3): outcomes 1 and 1 -> A_out = 0, a group GRPO is silent on.
    a = 1 / math.sqrt(2)
    advantages = torch.tensor(
        [
            [a, a + 0.3, 9.0],  # a step reward adds 0.3 to one token; 9.0 sits on a masked token
            [-a, -a, -a],
            [0.3, -0.3, 0.0],  # only the step rewards push on the silent group
            [0.0, 0.0, 0.0],
        ]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    out = advantage_composition(advantages, torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask)
    # 8 policy tokens; sum |A| = (2a + 0.3) + 3a + 0.6 = 5a + 0.9 = 4.435534; sum |A_out| = 5a = 3.535534;
    # sum |A - A_out| = 0.3 + 0.6 = 0.9; on the silent group |A| = 0.6.
    assert out["advantage_abs_mean"] == pytest.approx(4.435534 / 8, abs=1e-6)
    assert out["advantage_process_share"] == pytest.approx(0.9 / 4.435534, abs=1e-5)  # A_out divides by std + eps
    assert out["advantage_silent_share"] == pytest.approx(0.6 / 4.435534, abs=1e-5)
    # Outcome-only GRPO's own advantages: no step-reward share and nothing on the silent group.
    grpo = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))[:, None] * mask
    plain = advantage_composition(grpo, torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]), mask)
    assert plain == pytest.approx(
        {"advantage_abs_mean": 5 * a / 8, "advantage_process_share": 0.0, "advantage_silent_share": 0.0}, abs=1e-5
    )
    empty = advantage_composition(torch.zeros(2, 3), torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.zeros(2, 3))
    assert empty == {"advantage_abs_mean": 0.0, "advantage_process_share": 0.0, "advantage_silent_share": 0.0}
    with pytest.raises(ValueError, match="must be equal"):
        advantage_composition(advantages, torch.ones(4), torch.zeros(4), mask[:, :2])


def test_agreeing_rows_mark_the_rows_of_groups_with_nothing_to_compare() -> None:
    # Groups 0 [1, 0] (disagree), 1 [5, 5] (agree), 2 [3] (one row: agrees with itself).
    values = torch.tensor([1.0, 5.0, 0.0, 5.0, 3.0])
    groups = torch.tensor([0, 1, 0, 1, 2])
    assert agreeing_rows(values, groups).tolist() == [False, True, False, True, True]
    assert agreeing_rows(torch.zeros(0), torch.zeros(0, dtype=torch.long)).tolist() == []


def test_process_rows_leave_the_other_rows_with_their_outcome_advantage() -> None:
    # Only row 0 (A) gets the step term, standardised over all of group 0's steps as in the paper's
    # norm above (A_proc [-1, 1]); B's step gets A_out alone.
    rows = torch.tensor([True, False, False, False])
    got = dual_granularity_advantages(
        OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.5, process_norm="step", eps=0.0, process_rows=rows
    )
    want = _expected(0.5, {(0, 0): -1.0, (0, 1): 1.0, (2, 0): 0.0, (1, 0): 0.0})
    assert torch.allclose(got, want, atol=1e-6)
    all_rows = dual_granularity_advantages(
        OUTCOME,
        STEP_REWARDS,
        SPANS,
        MASK,
        GROUPS,
        beta=0.5,
        process_norm="step",
        eps=0.0,
        process_rows=torch.ones(4, dtype=torch.bool),
    )
    assert torch.equal(all_rows, dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, beta=0.5, eps=0.0))
    with pytest.raises(ValueError, match="process_rows"):
        dual_granularity_advantages(OUTCOME, STEP_REWARDS, SPANS, MASK, GROUPS, process_rows=torch.ones(3, dtype=torch.bool))


def test_sign_bounded_holds_steps_on_the_outcomes_side() -> None:
    steps = torch.tensor([1.5, -0.2, 0.0, 0.4])
    assert torch.equal(sign_bounded(torch.tensor(0.5), steps), torch.tensor([1.5, 0.0, 0.0, 0.4]))
    assert torch.equal(sign_bounded(torch.tensor(-0.5), steps), torch.tensor([0.0, -0.2, 0.0, 0.0]))
    assert torch.equal(sign_bounded(torch.tensor(0.0), steps), torch.zeros(4))
    assert sign_bounded(torch.tensor(1.0), torch.zeros(0)).numel() == 0
