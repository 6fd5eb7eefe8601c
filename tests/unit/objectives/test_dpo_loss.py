"""DPO: sequence log-probs and the loss against hand-computed numbers; gradient signs."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.objectives.dpo import dpo_loss, sequence_logprob
from twinrun.objectives.sft import completion_nll

LOGITS = torch.tensor([[[5.0, 1.0, 1.0], [0.0, 0.0, math.log(2.0)], [9.0, 9.0, 9.0]]])
IDS = torch.tensor([[0, 1, 2]])


def test_sequence_logprob_hand_computed() -> None:
    # only token 2 is a target; logits[1] = [0, 0, ln 2] -> p(2) = 2/4 = 0.5
    lp = sequence_logprob(LOGITS, IDS, torch.tensor([[0, 0, 1]]))
    assert lp.shape == (1,) and lp.dtype == torch.float32
    assert abs(lp.item() - math.log(0.5)) < 1e-6
    # both targets: log softmax([5,1,1])[1] + log 0.5
    both = sequence_logprob(LOGITS, IDS, torch.tensor([[0, 1, 1]])).item()
    first = math.log(math.exp(1.0) / (math.exp(5.0) + 2 * math.exp(1.0)))
    assert abs(both - (first + math.log(0.5))) < 1e-5
    # mask[0] never counts (token 0 has no prediction)
    assert sequence_logprob(LOGITS, IDS, torch.tensor([[1, 0, 0]])).item() == 0.0


def test_sequence_logprob_is_minus_sft_nll_bitwise() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 7, generator=g)
    ids = torch.randint(0, 7, (3, 6), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1]])
    assert torch.equal(sequence_logprob(logits, ids, mask), -completion_nll(logits, ids, mask)[0])


def test_sequence_logprob_ignores_padding_and_upcasts() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 5, generator=g)
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[0, 1, 1, 0]])
    base = sequence_logprob(logits, ids, mask)
    noisy = logits.clone()
    noisy[:, 2:] = 1e4  # position 2 predicts token 3 (masked out), position 3 predicts nothing
    assert torch.equal(sequence_logprob(noisy, ids, mask), base)
    assert sequence_logprob(logits.bfloat16(), ids, mask).dtype == torch.float32


def test_sequence_logprob_shape_errors() -> None:
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        sequence_logprob(torch.zeros(2, 3), IDS, IDS)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        sequence_logprob(LOGITS, IDS[:, :2], IDS)


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_dpo_hand_computed() -> None:
    # pc - rc = 1, pr - rr = -1, beta = 0.5: z = 1, loss = log(1 + e^-1)
    out = dpo_loss(t(-3.0), t(-6.0), t(-4.0), t(-5.0), beta=0.5)
    assert out.loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-15)
    assert out.loss.item() == pytest.approx(0.31326168751822286, abs=1e-15)
    assert out.reward_margin.item() == 1.0
    assert out.accuracy.item() == 1.0
    assert out.chosen_rewards.tolist() == [0.5] and out.rejected_rewards.tolist() == [-0.5]


def test_dpo_batch_of_pairs() -> None:
    # z = beta*(d_c - d_r): pair 0 -> 0.5*(1-(-1)) = 1; pair 1 -> 0.5*(0-2) = -1; pair 2 -> 0
    pc, rc = t(1.0, 0.0, 0.0), t(0.0, 0.0, 0.0)
    pr, rr = t(-1.0, 2.0, 0.0), t(0.0, 0.0, 0.0)
    out = dpo_loss(pc, pr, rc, rr, beta=0.5)
    want = [math.log1p(math.exp(-1.0)), math.log1p(math.exp(1.0)), math.log(2.0)]
    assert out.losses.tolist() == pytest.approx(want, abs=1e-15)
    assert out.loss.item() == pytest.approx(sum(want) / 3, abs=1e-15)
    assert out.reward_margin.item() == 0.0
    assert out.accuracy.item() == pytest.approx(1 / 3)  # a tie (pair 2) is not a win


def test_dpo_gradient_signs_and_values() -> None:
    pc, pr = t(-3.0).requires_grad_(), t(-6.0).requires_grad_()
    rc, rr = t(-4.0).requires_grad_(), t(-5.0).requires_grad_()
    out = dpo_loss(pc, pr, rc, rr, beta=0.5)
    out.loss.backward()
    s = 1.0 / (1.0 + math.exp(1.0))  # sigmoid(-z) at z = 1
    assert pc.grad is not None and pr.grad is not None
    assert pc.grad.item() < 0 < pr.grad.item()  # raise chosen, lower rejected
    assert pc.grad.item() == pytest.approx(-0.5 * s, abs=1e-15)
    assert pr.grad.item() == pytest.approx(0.5 * s, abs=1e-15)
    assert rc.grad is None and rr.grad is None  # the reference is a constant
    for metric in (out.reward_margin, out.accuracy, out.chosen_rewards, out.rejected_rewards):
        assert not metric.requires_grad


def test_dpo_upcasts_half_and_checks_inputs() -> None:
    x = torch.zeros(2, dtype=torch.bfloat16)
    assert dpo_loss(x, x, x, x, beta=0.1).loss.dtype == torch.float32
    y = torch.zeros(2)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(y, y, y, y, beta=0.0)
    with pytest.raises(ValueError, match="ref_rejected"):
        dpo_loss(y, y, y, torch.zeros(3), beta=0.1)
    with pytest.raises(ValueError, match="non-empty"):
        dpo_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0), torch.zeros(0), beta=0.1)
