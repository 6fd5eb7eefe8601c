"""SimPO's loss by hand: -logsigmoid(beta * (pc - pr) - gamma) over per-token log-probs, no
reference; its gradient, its metrics, and the refusals it shares with DPO's loss."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.objectives.simpo import simpo_loss


def t(*values: float, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def test_the_worked_example() -> None:
    # pc - pr = 1, beta 2, gamma 1: z = 1, loss = log(1 + e^-1)
    out = simpo_loss(t(-1.0), t(-2.0), 2.0, 1.0)
    assert out.losses.tolist() == [math.log1p(math.exp(-1.0))]
    assert out.loss.item() == pytest.approx(0.31326168751822286, abs=1e-15)
    assert out.accuracy.item() == 1.0
    assert out.reward_margin.item() == 2.0  # beta * (pc - pr)
    assert out.chosen_rewards.tolist() == [-2.0] and out.rejected_rewards.tolist() == [-4.0]


def test_the_margin_is_what_a_win_must_clear() -> None:
    # gap 0.25 at beta 2: z = 0.5 - gamma; at gamma 0.5, z = 0 and loss = log 2
    out = simpo_loss(t(-0.75, -3.0), t(-1.0, -1.0), 2.0, 0.5)
    assert out.losses.tolist() == [math.log(2.0), math.log1p(math.exp(4.0 + 0.5))]
    assert out.loss.item() == pytest.approx((math.log(2.0) + math.log1p(math.exp(4.5))) / 2)
    assert out.accuracy.item() == 0.5  # pair 1 prefers the rejected side
    assert simpo_loss(t(-1.0), t(-1.0), 2.0, 0.0).losses.tolist() == [math.log(2.0)]


def test_gradient_pushes_the_chosen_up_and_the_rejected_down() -> None:
    pc, pr = t(-1.0, grad=True), t(-2.0, grad=True)
    simpo_loss(pc, pr, 2.0, 1.0).loss.backward()
    assert pc.grad is not None and pr.grad is not None
    s = 1.0 / (1.0 + math.exp(1.0))  # sigmoid(-z) at z = 1
    assert pc.grad.tolist() == [pytest.approx(-2.0 * s, abs=1e-15)]
    assert pr.grad.tolist() == [pytest.approx(2.0 * s, abs=1e-15)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((t(-1.0), t(-1.0), 0.0, 0.5), "beta must be > 0"),
        ((t(-1.0), t(-1.0), 2.0, -0.1), "gamma must be >= 0"),
        ((t(-1.0), t(-1.0, -2.0), 2.0, 0.5), "policy_rejected has shape"),
        ((t(), t(), 2.0, 0.5), "non-empty"),
    ],
)
def test_bad_inputs_are_refused(args: tuple, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        simpo_loss(*args)
