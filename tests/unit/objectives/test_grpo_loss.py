"""The PPO-clip GRPO surrogate against hand-computed numbers and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.objectives.grpo import grpo_loss

F64 = torch.float64


def test_ratio_one_gives_minus_mean_advantage() -> None:
    old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=F64)
    logp = old.clone().requires_grad_(True)
    adv = torch.tensor([1.0, -2.0], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    out = grpo_loss(logp, old, adv, mask, denominator=4, clip_eps=0.2)
    assert out.loss.item() == -(1.0 + 1.0 - 2.0 - 2.0) / 4  # = -mean over tokens of A = 0.5
    assert out.clip_fraction == 0.0 and out.ratio_mean == 1.0
    out.loss.backward()
    # d/dlogp of -rho*A/D at rho=1 is -A/D
    assert logp.grad.tolist() == [[-0.25, -0.25], [0.5, 0.5]]


def test_clipped_token_contributes_clipped_value_and_no_gradient() -> None:
    old = torch.zeros(1, 2, dtype=F64)
    logp = torch.tensor([[math.log(1.5), 0.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([1.0], dtype=F64)
    out = grpo_loss(logp, old, adv, torch.ones(1, 2, dtype=torch.bool), 2, clip_eps=0.2)
    # token 0: rho 1.5 > 1.2 with A > 0 -> -1.2 (clipped); token 1: rho 1 -> -1
    assert out.loss.item() == pytest.approx(-(1.2 + 1.0) / 2, abs=1e-15)
    assert out.clip_fraction == 0.5 and out.clipped_tokens == 1 and out.active_tokens == 2
    assert out.ratio_mean == pytest.approx((1.5 + 1.0) / 2, abs=1e-15)
    out.loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == -0.5


def test_negative_advantage_clips_below_only() -> None:
    old = torch.zeros(1, 2, dtype=F64)
    # rho = 0.5: with A = -1 the clipped branch (-0.8) is the min -> loss 0.8, no gradient;
    # rho = 1.5 with A = -1 is NOT clipped (pessimistic bound): -min(-1.5, -1.2) = 1.5
    logp = torch.tensor([[math.log(0.5), math.log(1.5)]], dtype=F64, requires_grad=True)
    adv = torch.tensor([-1.0], dtype=F64)
    out = grpo_loss(logp, old, adv, torch.ones(1, 2, dtype=torch.bool), 1, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(0.8 + 1.5, abs=1e-14)
    assert out.clipped_tokens == 1
    out.loss.backward()
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(1.5, abs=1e-14)  # d(-rho*A)/dlogp = rho


def test_masked_positions_ignored_even_if_inf() -> None:
    old = torch.tensor([[0.0, 5.0, 0.0]], dtype=F64)
    logp = torch.tensor([[0.0, float("inf"), float("-inf")]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, False, False]])
    out = grpo_loss(logp, old, torch.tensor([2.0], dtype=F64), mask, 1, clip_eps=0.2)
    assert out.loss.item() == -2.0 and out.active_tokens == 1
    out.loss.backward()
    assert logp.grad.tolist() == [[-2.0, 0.0, 0.0]]


def test_denominator_makes_split_forwards_sum() -> None:
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(4, 5, generator=g, dtype=F64)
    logp = old + 0.3 * (torch.rand(4, 5, generator=g, dtype=F64) - 0.5)
    adv = torch.randn(4, generator=g, dtype=F64)
    mask = torch.rand(4, 5, generator=g) > 0.3
    denom = int(mask.sum())
    whole = grpo_loss(logp, old, adv, mask, denom, 0.1).loss
    parts = sum(
        grpo_loss(logp[s], old[s], adv[s], mask[s], denom, 0.1).loss
        for s in (slice(0, 1), slice(1, 4))
    )
    assert torch.allclose(whole, parts, rtol=0, atol=1e-15)


def test_gradcheck() -> None:
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    # stay away from the clip boundaries, where the surrogate is not differentiable
    logp = (old + 0.05 * torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda x: grpo_loss(x, old, adv, mask, 8, 0.5).loss, (logp,))


def test_float32_logprobs_float64_loss() -> None:
    old = torch.tensor([[-1.0, -1.0]], dtype=F64)
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float32, requires_grad=True)
    out = grpo_loss(
        logp, old, torch.tensor([1.0], dtype=F64), torch.ones(1, 2, dtype=torch.bool), 2, 0.2
    )
    assert out.loss.dtype == F64
    out.loss.backward()
    assert logp.grad.dtype == torch.float32 and logp.grad.tolist() == [[-0.5, -0.5]]


def test_row_weights_scale_rows() -> None:
    old = torch.zeros(2, 1, dtype=F64)
    logp = old.clone()
    adv = torch.tensor([1.0, 1.0], dtype=F64)
    mask = torch.ones(2, 1, dtype=torch.bool)
    w = torch.tensor([1.0, 0.5], dtype=F64)
    out = grpo_loss(logp, old, adv, mask, 2, 0.2, row_weights=w)
    assert out.loss.item() == -(1.0 + 0.5) / 2


def test_shape_and_argument_errors() -> None:
    z = torch.zeros(2, 3, dtype=F64)
    m = torch.ones(2, 3, dtype=torch.bool)
    a = torch.zeros(2, dtype=F64)
    with pytest.raises(ValueError):
        grpo_loss(z, z[:, :2], a, m, 1, 0.2)
    with pytest.raises(ValueError):
        grpo_loss(z, z, torch.zeros(3, dtype=F64), m, 1, 0.2)
    with pytest.raises(ValueError):
        grpo_loss(z, z, a, m, 0, 0.2)
    with pytest.raises(ValueError):
        grpo_loss(z, z, a, m, 1, 0.0)
