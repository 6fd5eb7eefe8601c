"""The update's logprobs: the float64 log-softmax over the kept positions only, in chunks of
`LOGPROB_CHUNK` positions, gives, bit for bit, the values and the gradient of the log-softmax
over every position — and keeps no [K, V] float64 tensor for the backward."""

from __future__ import annotations

import torch

from twinrun.objectives.grpo_logprobs import LOGPROB_CHUNK, kept_logprobs


def full_logprobs(logits: torch.Tensor, ids: torch.Tensor, t: float) -> torch.Tensor:
    logp = torch.log_softmax(logits[:, :-1].double() / t, dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def both(
    logits: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor, t: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kept_logprobs, the full log-softmax masked) and the gradients a weighted sum of each
    gives the logits."""
    weights = torch.randn(kept.shape, generator=torch.Generator().manual_seed(seed),
                          dtype=torch.float64)  # fmt: skip
    a = logits.clone().requires_grad_(True)
    got = kept_logprobs(a, ids, kept, t)
    (got * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    want = torch.where(kept, full_logprobs(b, ids, t), torch.zeros((), dtype=torch.float64))
    (want * weights).sum().backward()
    assert a.grad is not None and b.grad is not None
    return got, want, a.grad, b.grad


def test_kept_positions_equal_the_full_log_softmax_and_the_rest_are_zero() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    ids = torch.randint(0, 50, (3, 7), generator=g)
    kept = torch.zeros(3, 6, dtype=torch.bool)
    kept[0, 2:5] = kept[1, 4:] = True  # row 2 keeps nothing (all capped)

    got, want, grad, want_grad = both(logits, ids, kept, 0.7, 1)

    assert got.dtype == torch.float64
    assert torch.equal(got[kept], want[kept])
    assert torch.equal(got[~kept], torch.zeros(int((~kept).sum()), dtype=torch.float64))
    assert torch.equal(grad, want_grad)
    assert grad[2].abs().sum() == 0 and grad[0].abs().sum() > 0


def test_many_chunks_give_the_bits_of_one_log_softmax() -> None:
    """Long multi-turn rows: kept positions spread over several rows and many chunks (the last
    one partial), SmolLM2's vocabulary size; values and gradients bitwise equal."""
    g = torch.Generator().manual_seed(1)
    n, w, v = 3, 5 * LOGPROB_CHUNK // 2, 49152
    logits = torch.randn(n, w, v, generator=g) * 6
    ids = torch.randint(0, v, (n, w), generator=g)
    kept = torch.rand(n, w - 1, generator=g) < 0.7
    kept[:, : w // 4] = False  # the prompt
    assert int(kept.sum()) > 3 * LOGPROB_CHUNK and int(kept.sum()) % LOGPROB_CHUNK

    got, want, grad, want_grad = both(logits, ids, kept, 1.3, 2)

    assert torch.equal(got.view(torch.int64), want.view(torch.int64))
    assert torch.equal(grad.view(torch.int32), want_grad.view(torch.int32))


def test_no_float64_vocabulary_rows_are_kept_for_the_backward() -> None:
    """What autograd keeps of `kept_logprobs`: at most the kept rows' float32 logits, never a
    float64 tensor with a vocabulary dimension (before the chunks, the [K, V] float64
    log-softmax of every kept position was kept)."""
    g = torch.Generator().manual_seed(2)
    n, w, v = 2, 3 * LOGPROB_CHUNK, 1000
    logits = torch.randn(n, w, v, generator=g).requires_grad_(True)
    ids = torch.randint(0, v, (n, w), generator=g)
    kept = torch.ones(n, w - 1, dtype=torch.bool)
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        kept_logprobs(logits, ids, kept, 1.0)

    wide = [(shape, dtype) for shape, dtype in saved if shape and shape[-1] == v]
    assert wide, "the kept rows' logits are what the recompute reads"
    assert all(dtype == torch.float32 for _, dtype in wide), wide
    assert sum(shape[0] for shape, _ in wide) == int(kept.sum())
