"""The update's logprobs: the float64 log-softmax over the kept positions only gives, bit for bit,
the values and the gradient of the log-softmax over every position."""

from __future__ import annotations

import torch

from twinrun.train.recipes.grpo import kept_logprobs


def full_logprobs(logits: torch.Tensor, ids: torch.Tensor, t: float) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].double() / t, dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def test_kept_positions_equal_the_full_log_softmax_and_the_rest_are_zero() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    ids = torch.randint(0, 50, (3, 7), generator=g)
    kept = torch.zeros(3, 6, dtype=torch.bool)
    kept[0, 2:5] = kept[1, 4:] = True  # row 2 keeps nothing (all capped)
    weights = torch.randn(3, 6, generator=g, dtype=torch.float64)

    a = logits.clone().requires_grad_(True)
    got = kept_logprobs(a, ids, kept, 0.7)
    (got * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    want = full_logprobs(b, ids, 0.7)
    (torch.where(kept, want, torch.zeros((), dtype=torch.float64)) * weights).sum().backward()

    assert got.dtype == torch.float64
    assert torch.equal(got[kept], want[kept])
    assert torch.equal(got[~kept], torch.zeros(int((~kept).sum()), dtype=torch.float64))
    assert a.grad is not None and b.grad is not None
    assert torch.equal(a.grad, b.grad)
    assert a.grad[2].abs().sum() == 0 and a.grad[0].abs().sum() > 0
