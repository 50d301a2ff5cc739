"""The registered advantage estimators on one hand-computed batch: ``grpo`` (outcome only),
``dual`` (Eq. 7-8), ``cpgrpo`` (``|A| * pr``), ``dual_silent`` (``dual`` on the groups whose
outcomes agree, ``grpo`` elsewhere), ``dual_informative`` (its complement) and ``dual_signed`` (the
step term never reversing an outcome advantage's sign); ``dual`` without step rewards or with beta 0 is ``grpo``;
environment tokens and padding get 0; an unknown name lists the known ones."""

from __future__ import annotations

import math

import pytest
import torch

from prorag.method.advantages import ADVANTAGE_ESTIMATORS, AdvantageInputs

# One group of two rows. Row 0: outcome 1, one step (tokens 0-1) of reward 2, an environment
# token at 2, a generated token at 3 outside every step. Row 1: outcome 0, steps of reward -1
# (token 0) and 3 (tokens 1-2), padding at 3.
A = 1 / math.sqrt(2)  # outcomes [1, 0]: mean 0.5, sample std sqrt(0.5): A_out = [+A, -A]
MASK = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])


def inputs(beta: float = 0.5, with_steps: bool = True) -> AdvantageInputs:
    return AdvantageInputs(
        outcome=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        loss_mask=MASK,
        step_rewards=[torch.tensor([2.0]), torch.tensor([-1.0, 3.0])] if with_steps else None,
        step_spans=[[(0, 2)], [(0, 1), (1, 3)]] if with_steps else None,
        beta=beta,
        eps=0.0,
    )


def test_registry_holds_the_built_in_estimators() -> None:
    assert ADVANTAGE_ESTIMATORS.names()[:6] == ["grpo", "dual", "cpgrpo", "dual_silent", "dual_informative", "dual_signed"]
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'dula'.*'grpo', 'dual', 'cpgrpo'.*did you mean 'dual'"):
        ADVANTAGE_ESTIMATORS.get("dula")


def test_grpo_is_the_outcome_advantage_on_generated_tokens() -> None:
    got = ADVANTAGE_ESTIMATORS.get("grpo")(inputs())
    assert torch.allclose(got, torch.tensor([[A, A, 0, A], [-A, -A, -A, 0]]))


def test_dual_adds_beta_times_the_step_normalised_process_advantage() -> None:
    # Step rewards of the group [2, -1, 3]: mean 4/3, sample std sqrt(13/3).
    std = math.sqrt(13 / 3)
    p = [(2 - 4 / 3) / std, (-1 - 4 / 3) / std, (3 - 4 / 3) / std]
    expected = torch.tensor(
        [
            [A + 0.5 * p[0], A + 0.5 * p[0], 0.0, A],  # token 3: outside every step, A_out alone
            [-A + 0.5 * p[1], -A + 0.5 * p[2], -A + 0.5 * p[2], 0.0],
        ]
    )
    assert torch.allclose(ADVANTAGE_ESTIMATORS.get("dual")(inputs()), expected, atol=1e-6)


def test_dual_without_process_signal_is_grpo() -> None:
    grpo = ADVANTAGE_ESTIMATORS.get("grpo")(inputs())
    dual = ADVANTAGE_ESTIMATORS.get("dual")
    assert torch.equal(dual(inputs(beta=0.0)), grpo)
    assert torch.equal(dual(inputs(with_steps=False)), grpo)


def test_cpgrpo_takes_the_magnitude_from_the_outcome_and_the_sign_from_the_step() -> None:
    got = ADVANTAGE_ESTIMATORS.get("cpgrpo")(inputs())
    expected = torch.tensor([[2 * A, 2 * A, 0.0, A], [-1 * A, 3 * A, 3 * A, 0.0]])
    assert torch.allclose(got, expected, atol=1e-6)
    assert (got[MASK == 0] == 0).all()


def test_dual_standardises_within_group_and_step_kind() -> None:
    # Searches [2, -1] (row 0, row 1): mean 0.5, sample std sqrt(4.5): A_proc = [+A, -A]; the one
    # answer (3) has nothing to compare with: A_proc 0. With beta 0.5, A_out = [+A, -A]:
    # row 0's search 1.5 A, row 1's search -1.5 A, its answer -A; the token outside steps keeps A_out.
    batch = AdvantageInputs(
        **{**inputs().__dict__, "process_norm": "step_kind", "step_kinds": [["search"], ["search", "answer"]]}
    )
    got = ADVANTAGE_ESTIMATORS.get("dual")(batch)
    want = torch.tensor([[1.5 * A, 1.5 * A, 0.0, A], [-1.5 * A, -A, -A, 0.0]])
    assert torch.allclose(got, want, atol=1e-6)
    plain = ADVANTAGE_ESTIMATORS.get("dual")(inputs())
    assert not torch.allclose(plain, want, atol=1e-3)  # over all steps, the answer's 3 is compared with the searches
    with pytest.raises(ValueError, match="needs step_kinds"):
        ADVANTAGE_ESTIMATORS.get("dual")(AdvantageInputs(**{**inputs().__dict__, "process_norm": "step_kind"}))


def two_groups() -> AdvantageInputs:
    """Group 0 is inputs()'s batch (outcomes [1, 0]: GRPO has a signal); group 1 (rows 2, 3) has
    outcomes [0, 0] (all wrong: GRPO is silent), steps of reward 4 (row 2, tokens 0-1) and 1, 2
    (row 3, tokens 0 and 1-2). Group 1's steps [4, 1, 2]: mean 7/3, sample std sqrt(7/3)."""
    return AdvantageInputs(
        outcome=torch.tensor([1.0, 0.0, 0.0, 0.0]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        loss_mask=torch.cat([MASK, MASK]),
        step_rewards=[torch.tensor([2.0]), torch.tensor([-1.0, 3.0]), torch.tensor([4.0]), torch.tensor([1.0, 2.0])],
        step_spans=[[(0, 2)], [(0, 1), (1, 3)]] * 2,
        beta=0.5,
        eps=0.0,
    )


def test_dual_silent_gives_the_step_term_only_to_groups_whose_outcomes_agree() -> None:
    two = two_groups()
    std = math.sqrt(7 / 3)
    p = [(4 - 7 / 3) / std, (1 - 7 / 3) / std, (2 - 7 / 3) / std]
    want = torch.tensor(
        [
            [A, A, 0.0, A],  # group 0: GRPO's advantages, untouched by its step rewards
            [-A, -A, -A, 0.0],
            [0.5 * p[0], 0.5 * p[0], 0.0, 0.0],  # group 1: the step term alone (A_out = 0)
            [0.5 * p[1], 0.5 * p[2], 0.5 * p[2], 0.0],
        ]
    )
    got = ADVANTAGE_ESTIMATORS.get("dual_silent")(two)
    assert torch.allclose(got, want, atol=1e-6)
    # dual differs on group 0 only: its silent group gets the same step term.
    dual = ADVANTAGE_ESTIMATORS.get("dual")(two)
    assert torch.allclose(dual[2:], got[2:]) and not torch.allclose(dual[:2], got[:2])
    # Without step rewards, or at beta 0, it is grpo.
    grpo = ADVANTAGE_ESTIMATORS.get("grpo")(two)
    assert torch.equal(ADVANTAGE_ESTIMATORS.get("dual_silent")(AdvantageInputs(**{**two.__dict__, "beta": 0.0})), grpo)
    assert torch.equal(
        ADVANTAGE_ESTIMATORS.get("dual_silent")(inputs(with_steps=False)), ADVANTAGE_ESTIMATORS.get("grpo")(inputs())
    )


def test_dual_informative_gives_the_step_term_only_to_groups_whose_outcomes_disagree() -> None:
    two = two_groups()
    # Group 0's steps [2, -1, 3]: mean 4/3, sample std sqrt(13/3); A_out = [+A, -A].
    std = math.sqrt(13 / 3)
    p = [(2 - 4 / 3) / std, (-1 - 4 / 3) / std, (3 - 4 / 3) / std]
    want = torch.tensor(
        [
            [A + 0.5 * p[0], A + 0.5 * p[0], 0.0, A],  # group 0: Eq. 8, A_out + beta * A_proc on each step
            [-A + 0.5 * p[1], -A + 0.5 * p[2], -A + 0.5 * p[2], 0.0],
            [0.0, 0.0, 0.0, 0.0],  # group 1 (outcomes agree): GRPO's 0, its step rewards unused
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    got = ADVANTAGE_ESTIMATORS.get("dual_informative")(two)
    assert torch.allclose(got, want, atol=1e-6)
    # dual differs on the silent group only; with dual_silent the two split dual between them.
    dual = ADVANTAGE_ESTIMATORS.get("dual")(two)
    assert torch.allclose(dual[:2], got[:2]) and not torch.allclose(dual[2:], got[2:])
    silent = ADVANTAGE_ESTIMATORS.get("dual_silent")(two)
    assert torch.allclose(torch.cat([got[:2], silent[2:]]), dual)
    grpo = ADVANTAGE_ESTIMATORS.get("grpo")(two)
    assert torch.equal(ADVANTAGE_ESTIMATORS.get("dual_informative")(AdvantageInputs(**{**two.__dict__, "beta": 0.0})), grpo)


def test_dual_signed_never_reverses_an_outcome_advantage() -> None:
    # beta 2 so that the step term reverses a sign: group 0's steps [2, -1, 3] standardise to
    # p = (r - 4/3) / sqrt(13/3); row 1's second step, -A + 2 * p[2] = +0.894 under dual, is held at 0.
    two = AdvantageInputs(**{**two_groups().__dict__, "beta": 2.0})
    std = math.sqrt(13 / 3)
    p = [(2 - 4 / 3) / std, (-1 - 4 / 3) / std, (3 - 4 / 3) / std]
    assert -A + 2 * p[2] > 0  # the reversal dual would make
    want = torch.tensor(
        [
            [A + 2 * p[0], A + 2 * p[0], 0.0, A],  # same sign as A_out: kept
            [-A + 2 * p[1], 0.0, 0.0, 0.0],  # the reversed step held at 0
            [0.0, 0.0, 0.0, 0.0],  # group 1 (outcomes agree): 0, its step term dropped
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    got = ADVANTAGE_ESTIMATORS.get("dual_signed")(two)
    assert torch.allclose(got, want, atol=1e-6)
    dual = ADVANTAGE_ESTIMATORS.get("dual")(two)
    assert dual[1, 1] > 0 and torch.allclose(dual[0], got[0])
    # At the paper's beta no step of this batch reverses: dual_signed is dual_informative there.
    half = two_groups()
    assert torch.allclose(ADVANTAGE_ESTIMATORS.get("dual_signed")(half), ADVANTAGE_ESTIMATORS.get("dual_informative")(half))
    grpo = ADVANTAGE_ESTIMATORS.get("grpo")(two)
    assert torch.equal(ADVANTAGE_ESTIMATORS.get("dual_signed")(AdvantageInputs(**{**two.__dict__, "beta": 0.0})), grpo)


def test_zero_gives_no_token_an_advantage_whatever_the_rewards() -> None:
    got = ADVANTAGE_ESTIMATORS.get("zero")(inputs())
    assert got.shape == MASK.shape and got.dtype == torch.float32
    assert torch.equal(got, torch.zeros(2, 4))
    assert "zero" in ADVANTAGE_ESTIMATORS.names()
