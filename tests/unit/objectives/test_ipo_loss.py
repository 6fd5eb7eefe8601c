"""IPO's loss by hand: (h - 1/(2 tau))^2 with h the gap of the two log-ratios, its gradient, the
metrics it shares with DPO, and the same refusals as DPO's loss."""

from __future__ import annotations

import pytest
import torch

from twinrun.objectives.ipo import ipo_loss


def t(*values: float, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=grad)


def test_the_worked_example() -> None:
    # pc - rc = 1, pr - rr = -1: h = 2; tau = 0.1: target 5; loss (2 - 5)^2 = 9
    out = ipo_loss(t(-1.0), t(-3.0), t(-2.0), t(-2.0), 0.1)
    assert out.losses.tolist() == [9.0]
    assert out.loss.item() == 9.0
    assert out.accuracy.item() == 1.0
    assert out.reward_margin.item() == pytest.approx(0.2)  # tau * h
    assert out.chosen_rewards.tolist() == pytest.approx([0.1])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.1])


def test_a_batch_is_the_mean_and_the_gap_on_target_costs_nothing() -> None:
    # pair 0: h = 0 -> (0 - 2.5)^2 = 6.25 (tau 0.2); pair 1: h = 2.5 -> 0
    out = ipo_loss(t(-1.0, 0.5), t(-1.0, -2.0), t(-1.0, 0.0), t(-1.0, 0.0), 0.2)
    assert out.losses.tolist() == [6.25, 0.0]
    assert out.loss.item() == 3.125
    assert out.accuracy.item() == 0.5  # h > 0 for pair 1 only (h = 0 is not a win)


def test_gradient_pulls_the_gap_towards_its_target() -> None:
    pc, pr = t(-1.0, grad=True), t(-3.0, grad=True)
    rc, rr = t(-2.0, grad=True), t(-2.0, grad=True)
    ipo_loss(pc, pr, rc, rr, 0.1).loss.backward()
    assert pc.grad is not None and pr.grad is not None
    assert pc.grad.tolist() == [-6.0]  # 2 (h - 5) with h = 2
    assert pr.grad.tolist() == [6.0]
    assert rc.grad is None and rr.grad is None  # the reference is a constant


def test_bf16_log_probs_are_upcast() -> None:
    out = ipo_loss(*(x.to(torch.bfloat16) for x in (t(-1.0), t(-3.0), t(-2.0), t(-2.0))), 0.1)
    assert out.loss.dtype == torch.float32 and out.loss.item() == 9.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((t(-1.0), t(-1.0), t(-1.0), t(-1.0), 0.0), "beta must be > 0"),
        ((t(-1.0, -2.0), t(-1.0), t(-1.0, -2.0), t(-1.0, -2.0), 0.1), "policy_rejected has shape"),
        ((torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0), 0.1), "non-empty"),
    ],
)
def test_refusals(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ipo_loss(*args)
