"""An RL update's signal and noise from weights (`research.analysis.update_noise`), on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from research.analysis.update_noise import (
    adam_noise_ratio,
    adam_signal_ratio,
    apply_delta,
    delta_cosine,
    delta_rms,
    mean_delta,
    permuted_delta,
    second_order_split,
    update_delta,
)


def test_update_delta_subtracts_per_tensor_in_float32_and_skips_integer_buffers() -> None:
    initial = {"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "n": torch.tensor([3])}
    final = {"w": torch.tensor([1.5, 1.0], dtype=torch.bfloat16), "n": torch.tensor([4])}
    delta = update_delta(initial, final)
    assert set(delta) == {"w"}
    assert delta["w"].dtype == torch.float32 and delta["w"].tolist() == [0.5, -1.0]


def test_update_delta_names_the_mismatch() -> None:
    with pytest.raises(ValueError, match="'b'"):
        update_delta({"a": torch.zeros(2)}, {"a": torch.zeros(2), "b": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"'a': shape \(2,\) against \(3,\)"):
        update_delta({"a": torch.zeros(2)}, {"a": torch.zeros(3)})


def test_rms_and_cosine_by_hand() -> None:
    a = {"x": torch.tensor([3.0, 4.0]), "y": torch.tensor([0.0])}
    assert delta_rms(a) == pytest.approx(math.sqrt(25 / 3))
    b = {"x": torch.tensor([4.0, -3.0]), "y": torch.tensor([0.0])}
    assert delta_cosine(a, b) == pytest.approx(0.0)
    assert delta_cosine(a, a) == pytest.approx(1.0)
    assert delta_cosine(a, {k: -v for k, v in a.items()}) == pytest.approx(-1.0)
    # (3*1 + 4*1 + 0*2) / (5 * sqrt(6))
    c = {"x": torch.tensor([1.0, 1.0]), "y": torch.tensor([2.0])}
    assert delta_cosine(a, c) == pytest.approx(7 / (5 * math.sqrt(6)))
    assert delta_cosine(a, {k: torch.zeros_like(v) for k, v in a.items()}) == 0.0
    with pytest.raises(ValueError, match="different tensors"):
        delta_cosine(a, {"x": torch.zeros(2)})


def test_permuted_delta_keeps_each_tensors_values_and_is_seeded() -> None:
    delta = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.tensor([5.0, -5.0, 1.0])}
    first = permuted_delta(delta, torch.Generator().manual_seed(0))
    again = permuted_delta(delta, torch.Generator().manual_seed(0))
    other = permuted_delta(delta, torch.Generator().manual_seed(1))
    for name, tensor in delta.items():
        assert first[name].shape == tensor.shape
        assert sorted(first[name].flatten().tolist()) == sorted(tensor.flatten().tolist())
        assert torch.equal(first[name], again[name])
    assert not torch.equal(first["w"], delta["w"])  # 12! orders: seed 0 does not draw the identity
    assert not torch.equal(first["w"], other["w"])
    assert delta_rms(first) == pytest.approx(delta_rms(delta))


def test_apply_delta_scales_and_keeps_dtypes() -> None:
    initial = {"w": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "n": torch.tensor([7])}
    delta = {"w": torch.tensor([0.5, -0.25])}
    minus = apply_delta(initial, delta, -1.0)
    assert minus["w"].dtype == torch.bfloat16 and minus["w"].tolist() == [0.5, 2.25]
    assert minus["n"].tolist() == [7]
    assert apply_delta(initial, delta)["w"].tolist() == [1.5, 1.75]


def test_second_order_split_by_hand() -> None:
    # EM 30 at the start, 28 after the update, 26 after the mirrored one: the direction is worth +1,
    # a step of that size costs 3 either way, and the two add to the run's -2.
    split = second_order_split(30.0, 28.0, 26.0)
    assert split == {"change": -2.0, "linear": 1.0, "quadratic": -3.0}
    assert split["linear"] + split["quadratic"] == split["change"]
    # a purely quadratic score (EM(x) = -x^2) has no linear part at any step size
    assert second_order_split(0.0, -4.0, -4.0)["linear"] == 0.0


def test_adam_noise_ratio_limits_and_a_simulation() -> None:
    # step 1: m_hat is the gradient itself, E|g| / sigma = sqrt(2 / pi)
    assert adam_noise_ratio(0.9, 1) == pytest.approx(math.sqrt(2 / math.pi))
    # long runs: the stationary EMA, variance (1 - b) / (1 + b)
    assert adam_noise_ratio(0.9, 10_000) == pytest.approx(math.sqrt(2 / math.pi * 0.1 / 1.9))
    assert adam_noise_ratio(0.0, 5) == pytest.approx(math.sqrt(2 / math.pi))
    # Adam's own first moment on Gaussian noise, many weights at once
    generator = torch.Generator().manual_seed(0)
    m = torch.zeros(200_000)
    for _ in range(48):
        m = 0.9 * m + 0.1 * torch.randn(200_000, generator=generator)
    simulated = float((m / (1 - 0.9**48)).abs().mean())
    assert simulated == pytest.approx(adam_noise_ratio(0.9, 48), rel=0.02)
    with pytest.raises(ValueError, match="beta1"):
        adam_noise_ratio(1.0, 3)


def test_adam_signal_ratio_on_torch_adamws_own_state() -> None:
    """A constant gradient drives |m_hat| / sqrt(v_hat) to 1; the state read is AdamW's own."""
    weight = torch.nn.Parameter(torch.zeros(4))
    optimiser = torch.optim.AdamW([weight], lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(5):
        optimiser.zero_grad()
        weight.grad = torch.tensor([1.0, -2.0, 0.5, 3.0])
        optimiser.step()
    state = optimiser.state[weight]
    ratio = adam_signal_ratio([(state["exp_avg"], state["exp_avg_sq"])], int(state["step"]), (0.9, 0.999))
    assert ratio == pytest.approx(1.0, abs=1e-6)
    # hand-made: m_hat = 0.5 * sigma for one weight, 0 for the other -> mean 0.25
    step, betas = 1, (0.5, 0.5)
    exp_avg = torch.tensor([0.25, 0.0])  # m_hat = exp_avg / 0.5
    exp_avg_sq = torch.tensor([0.5, 0.5])  # v_hat = 1
    assert adam_signal_ratio([(exp_avg, exp_avg_sq)], step, betas, eps=0.0) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="empty"):
        adam_signal_ratio([], 1, (0.9, 0.999))


def test_mean_delta_averages_per_tensor_and_refuses_mismatched_updates() -> None:
    a = {"w": torch.tensor([2.0, 0.0]), "b": torch.tensor([1.0])}
    b = {"w": torch.tensor([0.0, 4.0]), "b": torch.tensor([-1.0])}
    soup = mean_delta([a, b])
    assert soup["w"].tolist() == [1.0, 2.0] and soup["b"].tolist() == [0.0]
    assert mean_delta([a])["w"].tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="update 1 covers other tensors"):
        mean_delta([a, {"w": torch.zeros(2)}])
    with pytest.raises(ValueError, match="no updates"):
        mean_delta([])
