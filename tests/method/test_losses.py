"""The format-aware SFT loss: hand-computed values, masking, weight schemes, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from prorag.agent.schema import CONTROL_TAG_WEIGHTS, TAGS
from prorag.method.losses import (
    format_token_weights,
    loss_normalizer,
    reduce_weighted_nll,
    tag_weight_table,
    token_nll,
    weighted_lm_loss,
)

#: Fake tag ids 10..19, in TAGS order.
TAG_IDS = {tag: 10 + i for i, tag in enumerate(TAGS)}


def nll(row: list[float], target: int) -> float:
    """-log softmax(row)[target], by hand."""
    return -(row[target] - math.log(sum(math.exp(x) for x in row)))


# A toy batch: V = 3, T = 4, two rows.
LOGITS = [
    [[2.0, 0.0, -1.0], [0.5, 1.5, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]],
    [[0.0, 1.0, 0.0], [-2.0, 0.0, 2.0], [1.0, -1.0, 0.5], [0.3, 0.2, 0.1]],
]
IDS = [[0, 1, 2, 0], [2, 0, 2, 1]]


def toy() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(LOGITS), torch.tensor(IDS)


def test_token_nll_is_shifted_by_one() -> None:
    logits, ids = toy()
    got = token_nll(logits, ids)
    assert got.shape == (2, 3)
    for b in range(2):
        for t in range(3):
            assert got[b, t].item() == pytest.approx(nll(LOGITS[b][t], IDS[b][t + 1]), abs=1e-6)


def test_weighted_mean_by_hand() -> None:
    logits, ids = toy()
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 2.0, 5.0]])
    # targets: row 0 positions 1 (w 1) and 2 (w 3); row 1 positions 2 (w 2) and 3 (w 5)
    num = 1 * nll(LOGITS[0][0], 1) + 3 * nll(LOGITS[0][1], 2) + 2 * nll(LOGITS[1][1], 2) + 5 * nll(LOGITS[1][2], 1)
    expected = num / (1 + 3 + 2 + 5)
    assert weighted_lm_loss(logits, ids, weights).item() == pytest.approx(expected, abs=1e-6)
    assert weighted_lm_loss(logits, ids, weights, "weighted_mean").item() == pytest.approx(expected, abs=1e-6)


def test_sum_form_divides_by_target_count() -> None:
    logits, ids = toy()
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 2.0, 5.0]])
    num = 1 * nll(LOGITS[0][0], 1) + 3 * nll(LOGITS[0][1], 2) + 2 * nll(LOGITS[1][1], 2) + 5 * nll(LOGITS[1][2], 1)
    assert weighted_lm_loss(logits, ids, weights, "sum").item() == pytest.approx(num / 4, abs=1e-6)


def test_uniform_weights_give_plain_mean_nll() -> None:
    logits, ids = toy()
    weights = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    plain = sum(nll(LOGITS[b][t], IDS[b][t + 1]) for b in range(2) for t in range(3)) / 6
    assert weighted_lm_loss(logits, ids, weights).item() == pytest.approx(plain, abs=1e-6)
    assert weighted_lm_loss(logits, ids, weights, "sum").item() == pytest.approx(plain, abs=1e-6)


def test_position_zero_weight_never_counts() -> None:
    logits, ids = toy()
    w = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    w0 = w.clone()
    w0[:, 0] = 7.0  # nothing predicts position 0
    assert weighted_lm_loss(logits, ids, w0).item() == pytest.approx(weighted_lm_loss(logits, ids, w).item())


def test_masked_positions_never_contribute() -> None:
    logits, ids = toy()
    input_mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    table = {2: 4.0}
    weights = format_token_weights(ids, input_mask, table)
    base = weighted_lm_loss(logits, ids, weights)
    base_sum = weighted_lm_loss(logits, ids, weights, "sum")
    # Change the targets at masked positions and the logits that predict them.
    ids2, logits2 = ids.clone(), logits.clone()
    ids2[0, 2], ids2[1, 0], ids2[1, 3] = 1, 1, 2
    logits2[0, 1] = torch.tensor([9.0, -9.0, 4.0])
    logits2[1, 2] = torch.tensor([-50.0, 50.0, -50.0])
    logits2[:, 3] = 123.0  # the last logit predicts nothing
    weights2 = format_token_weights(ids2, input_mask, table)
    assert torch.equal(weights2 * (input_mask == 0), torch.zeros_like(weights2))
    assert weighted_lm_loss(logits2, ids2, weights2).item() == pytest.approx(base.item(), abs=1e-6)
    assert weighted_lm_loss(logits2, ids2, weights2, "sum").item() == pytest.approx(base_sum.item(), abs=1e-6)
    # And the gradient at masked positions is exactly zero.
    leaf = logits2.clone().requires_grad_(True)
    weighted_lm_loss(leaf, ids2, weights2).backward()
    assert torch.all(leaf.grad[0, 1] == 0) and torch.all(leaf.grad[1, 2] == 0) and torch.all(leaf.grad[:, 3] == 0)


def test_all_masked_batch_is_zero_without_nan() -> None:
    logits, ids = toy()
    logits = logits.clone().requires_grad_(True)
    weights = torch.zeros(2, 4)
    for reduction in ("weighted_mean", "sum"):
        loss = weighted_lm_loss(logits, ids, weights, reduction)
        assert loss.item() == 0.0 and not torch.isnan(loss)
        loss.backward()
        assert torch.isfinite(logits.grad).all() and torch.all(logits.grad == 0)


def test_format_token_weights() -> None:
    table = tag_weight_table(TAG_IDS, "reference")
    ids = torch.tensor([[3, TAG_IDS["<step>"], 4, TAG_IDS["</step>"], TAG_IDS["<answer>"], 5, TAG_IDS["</answer>"], 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])
    got = format_token_weights(ids, mask, table)
    assert got.dtype == torch.float32
    assert got.tolist() == [[0.0, 1.0, 1.0, 2.0, 5.0, 1.0, 5.0, 0.0]]
    # A masked tag (environment-written <retrieval>, <step> opener) weighs 0.
    env = torch.tensor([[TAG_IDS["<retrieval>"], TAG_IDS["<step>"], TAG_IDS["<subquery>"]]])
    assert format_token_weights(env, torch.tensor([[0, 0, 1]]), table).tolist() == [[0.0, 0.0, 3.0]]
    assert format_token_weights(env, torch.tensor([[1, 1, 1]]), {}, default=0.5).tolist() == [[0.5, 0.5, 0.5]]
    with pytest.raises(ValueError):
        format_token_weights(ids, mask[:, :3], table)


def test_reference_scheme_weights() -> None:
    table = tag_weight_table(TAG_IDS)  # default: reference
    by_tag = {tag: table[TAG_IDS[tag]] for tag in TAGS}
    assert by_tag == dict(CONTROL_TAG_WEIGHTS)
    assert by_tag["<answer>"] == by_tag["</answer>"] == 5.0
    for tag in ("<subquery>", "</subquery>", "<subanswer>", "</subanswer>"):
        assert by_tag[tag] == 3.0
    assert by_tag["</step>"] == 2.0
    assert by_tag["<step>"] == by_tag["<retrieval>"] == by_tag["</retrieval>"] == 1.0
    custom = tag_weight_table(TAG_IDS, "reference", weights={"</step>": 4.0})
    assert custom[TAG_IDS["</step>"]] == 4.0 and custom[TAG_IDS["<answer>"]] == 5.0


def test_paper_scheme_lambda() -> None:
    table = tag_weight_table(TAG_IDS, "paper", 2.5)
    assert set(table) == set(TAG_IDS.values())
    assert all(w == 2.5 for w in table.values())
    with pytest.raises(ValueError, match="lambda > 1"):
        tag_weight_table(TAG_IDS, "paper", 1.0)
    with pytest.raises(ValueError, match="unknown weight scheme"):
        tag_weight_table(TAG_IDS, "other", 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lacks"):
        tag_weight_table({"<step>": 1}, "paper", 2.0)
    with pytest.raises(ValueError, match="not a trajectory tag"):
        tag_weight_table(TAG_IDS, "paper", 2.0, weights={"<Step>": 2.0})


def test_paper_lambda_in_loss_by_hand() -> None:
    # Row: [prompt 0, tag 10 (<step>), token 1, tag 11 (</step>)], all but the prompt targets.
    logits = torch.tensor([[[0.0, 1.0, 0.0] + [0.0] * 9, [1.0, 2.0, 0.0] + [0.0] * 9, [0.0] * 12, [0.0] * 12]])
    logits[0, 0, 10] = 2.0
    logits[0, 2, 11] = 1.0
    ids = torch.tensor([[0, 10, 1, 11]])
    mask = torch.tensor([[0, 1, 1, 1]])
    weights = format_token_weights(ids, mask, tag_weight_table(TAG_IDS, "paper", 4.0))
    assert weights.tolist() == [[0.0, 4.0, 1.0, 4.0]]
    rows = logits[0].tolist()
    n1, n2, n3 = nll(rows[0], 10), nll(rows[1], 1), nll(rows[2], 11)
    assert weighted_lm_loss(logits, ids, weights, "sum").item() == pytest.approx((4 * n1 + n2 + 4 * n3) / 3, abs=1e-6)
    assert weighted_lm_loss(logits, ids, weights).item() == pytest.approx((4 * n1 + n2 + 4 * n3) / 9, abs=1e-6)


def test_normalizer_makes_accumulation_exact() -> None:
    """Two micro-batches normalised by the total weight add up to the loss of the whole batch."""
    logits, ids = toy()
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 2.0, 5.0]])
    for reduction in ("weighted_mean", "sum"):
        whole = weighted_lm_loss(logits, ids, weights, reduction)
        total = loss_normalizer(weights, reduction)
        parts = sum(
            weighted_lm_loss(logits[i : i + 1], ids[i : i + 1], weights[i : i + 1], reduction, normalizer=total) for i in range(2)
        )
        assert parts.item() == pytest.approx(whole.item(), abs=1e-6)
    assert loss_normalizer(weights, "weighted_mean").item() == 11.0
    assert loss_normalizer(weights, "sum").item() == 4.0
    with pytest.raises(ValueError):
        loss_normalizer(weights, "mean")  # type: ignore[arg-type]


def test_shape_errors() -> None:
    logits, ids = toy()
    with pytest.raises(ValueError):
        weighted_lm_loss(logits, ids, torch.ones(2, 3))
    with pytest.raises(ValueError):
        weighted_lm_loss(logits[:, :3], ids, torch.ones(2, 4))


def test_reduce_weighted_nll_is_the_reduction_of_weighted_lm_loss() -> None:
    logits, ids = toy()
    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 2.0, 5.0]])
    nll = token_nll(logits, ids)
    for reduction in ("weighted_mean", "sum"):
        assert torch.equal(reduce_weighted_nll(nll, weights, reduction), weighted_lm_loss(logits, ids, weights, reduction))
    # A fused head reports 0 (or anything) at untargeted positions: they are ignored.
    noisy = nll.clone()
    noisy[0, 2] = float("inf")
    noisy[1, 0] = 1e9
    assert reduce_weighted_nll(noisy, weights).item() == pytest.approx(weighted_lm_loss(logits, ids, weights).item())
    with pytest.raises(ValueError):
        reduce_weighted_nll(nll, weights[:, :3])


# ----------------------------------------------------------------------------- PPO-clip (RL, Eq. 9)


def test_ppo_clip_loss_on_hand_computed_ratios() -> None:
    from prorag.method.losses import ppo_clip_loss

    # Ratios 1.5, 0.5, 1.5, 0.5 (and a masked token); epsilon 0.2:
    #   A = +1, r = 1.5: min(1.5, 1.2)   = 1.2  -> loss -1.2   (clipped: no push beyond 1 + eps)
    #   A = +1, r = 0.5: min(0.5, 0.8)   = 0.5  -> loss -0.5
    #   A = -1, r = 1.5: min(-1.5, -1.2) = -1.5 -> loss  1.5   (unclipped: pessimistic bound)
    #   A = -2, r = 0.5: min(-1, -1.6)   = -1.6 -> loss  1.6   (clipped at 1 - eps)
    old = torch.zeros(2, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 7.0], [1.5, 0.5, 1.0]]))
    adv = torch.tensor([[1.0, 1.0, 1e6], [-1.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    per_token = [-1.2, -0.5, 1.5, 1.6]
    assert ppo_clip_loss(new, old, adv, mask).item() == pytest.approx(sum(per_token) / 4)
    assert ppo_clip_loss(new, old, adv, mask, aggregation="sequence_mean").item() == pytest.approx(
        ((-1.2 - 0.5) / 2 + (1.5 + 1.6) / 2) / 2
    )
    assert ppo_clip_loss(new, old, adv, mask, aggregation="sum", normalizer=3).item() == pytest.approx(sum(per_token) / (2 * 3))
    # Asymmetric clipping: epsilon_high 0.6 lets the first ratio count in full.
    assert ppo_clip_loss(new, old, adv, mask, epsilon_high=0.6).item() == pytest.approx((-1.5 - 0.5 + 1.5 + 1.6) / 4)
    # One advantage per row (GRPO) is broadcast over the row's tokens.
    rowwise = ppo_clip_loss(new, old, torch.tensor([1.0, -1.0]), mask)
    assert rowwise.item() == pytest.approx((-1.2 - 0.5 + 1.5 + 0.8) / 4)


def test_ppo_clip_loss_ignores_masked_tokens_entirely() -> None:
    from prorag.method.losses import ppo_clip_loss

    logp = torch.tensor([[-1.0, float("-inf"), -2.0]], requires_grad=True)
    old = torch.tensor([[-1.1, 0.0, -2.0]])
    mask = torch.tensor([[1, 0, 1]])
    loss = ppo_clip_loss(logp, old, torch.tensor([[2.0, float("nan"), -1.0]]), mask)
    assert torch.isfinite(loss)
    loss.backward()
    assert logp.grad[0, 1] == 0
    with pytest.raises(ValueError, match="normalizer"):
        ppo_clip_loss(logp, old, torch.ones(1, 3), mask, aggregation="sum")
