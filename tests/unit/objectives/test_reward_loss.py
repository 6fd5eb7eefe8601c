"""Reward modelling: last-token pooling and the Bradley-Terry loss, hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.objectives.reward import bradley_terry_loss, last_token_index, pool_last


def test_last_token_index_right_padding() -> None:
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    assert last_token_index(mask).tolist() == [3, 1, 0]
    assert last_token_index(mask.bool()).tolist() == [3, 1, 0]


@pytest.mark.parametrize(
    ("mask", "match"),
    [
        ([[1, 1], [0, 0]], r"rows \[1\] have no real token"),
        ([[0, 1, 1], [1, 1, 0]], r"rows \[0\] are not right-padded"),
        ([[1, 2]], "only 0 and 1"),
    ],
)
def test_last_token_index_rejects_bad_masks(mask: list[list[int]], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        last_token_index(torch.tensor(mask))


def test_pool_last_picks_last_real_token() -> None:
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert pool_last(hidden, mask).tolist() == [[4.0, 5.0], [8.0, 9.0]]
    # padding values do not matter, and a row pools the same alone or in a batch
    noisy = hidden.clone()
    noisy[1, 2] = 1e9
    assert torch.equal(pool_last(noisy, mask), pool_last(hidden, mask))
    assert torch.equal(pool_last(hidden[1:, :2], mask[1:, :2])[0], pool_last(hidden, mask)[1])
    with pytest.raises(ValueError, match=r"\[B, T, H\]"):
        pool_last(hidden, mask[:, :2])


def test_bradley_terry_hand_computed() -> None:
    # d = [3-1, 0-1] = [2, -1]: loss = (log(1+e^-2) + log(1+e)) / 2
    c = torch.tensor([3.0, 0.0], dtype=torch.float64)
    r = torch.tensor([1.0, 1.0], dtype=torch.float64)
    out = bradley_terry_loss(c, r)
    want = [math.log1p(math.exp(-2.0)), math.log1p(math.exp(1.0))]
    assert out.losses.tolist() == pytest.approx(want, abs=1e-15)
    assert out.loss.item() == pytest.approx(0.7200948492805977, abs=1e-15)
    assert out.accuracy.item() == 0.5
    assert out.margin.item() == 0.5


def test_bradley_terry_tie_and_gradient() -> None:
    c = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    r = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    out = bradley_terry_loss(c, r)
    assert out.losses[0].item() == pytest.approx(math.log(2.0), abs=1e-15)  # a tie: p = 1/2
    assert out.accuracy.item() == 0.5  # a tie is not a win
    out.loss.backward()
    assert c.grad is not None and r.grad is not None
    # d loss / d c_i = -sigmoid(-d_i) / P
    want = [-0.5 / 2, -1.0 / (1.0 + math.exp(2.0)) / 2]
    assert c.grad.tolist() == pytest.approx(want, abs=1e-15)
    assert r.grad.tolist() == pytest.approx([-g for g in want], abs=1e-15)
    assert not out.accuracy.requires_grad and not out.margin.requires_grad


def test_bradley_terry_upcasts_and_checks_shapes() -> None:
    x = torch.zeros(3, dtype=torch.bfloat16)
    assert bradley_terry_loss(x, x).loss.dtype == torch.float32
    with pytest.raises(ValueError, match="must match"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="non-empty"):
        bradley_terry_loss(torch.zeros(0), torch.zeros(0))
