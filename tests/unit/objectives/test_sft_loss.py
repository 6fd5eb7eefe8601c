"""Completion-only SFT loss against hand-computed numbers."""

from __future__ import annotations

import math

import torch

from twinrun.objectives.sft import completion_nll


def test_completion_nll_hand_computed() -> None:
    # vocab 3, one row of 3 tokens [0, 1, 2]; mask says only token 2 is a completion token.
    # target of position 1 is token 2: logits[1] = [0, 0, ln 2] -> p(2) = 2/4 = 0.5
    logits = torch.tensor([[[5.0, 1.0, 1.0], [0.0, 0.0, math.log(2.0)], [9.0, 9.0, 9.0]]])
    ids = torch.tensor([[0, 1, 2]])
    mask = torch.tensor([[0, 0, 1]])
    sums, counts = completion_nll(logits, ids, mask)
    assert counts.tolist() == [1]
    assert sums.item() == torch.tensor(math.log(2.0), dtype=torch.float32).item()


def test_prompt_tokens_do_not_count() -> None:
    # both targets masked in: -log softmax([5,1,1])[1] + -log 0.5
    logits = torch.tensor([[[5.0, 1.0, 1.0], [0.0, 0.0, math.log(2.0)], [9.0, 9.0, 9.0]]])
    ids = torch.tensor([[0, 1, 2]])
    both = completion_nll(logits, ids, torch.tensor([[0, 1, 1]]))[0].item()
    first = -math.log(math.exp(1.0) / (math.exp(5.0) + 2 * math.exp(1.0)))
    assert abs(both - (first + math.log(2.0))) < 1e-5
    none = completion_nll(logits, ids, torch.tensor([[1, 0, 0]]))  # token 0 is never a target
    assert none[0].item() == 0.0 and none[1].item() == 0


def test_rows_are_independent() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    ids = torch.tensor([[1, 2, 3, 4], [4, 3, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])
    sums, counts = completion_nll(logits, ids, mask)
    one, c1 = completion_nll(logits[1:, :2], ids[1:, :2], mask[1:, :2])
    assert counts.tolist() == [3, 1]
    assert sums[1].item() == one.item() and c1.item() == 1
