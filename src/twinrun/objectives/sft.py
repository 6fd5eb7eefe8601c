"""Supervised fine-tuning loss: next-token negative log-likelihood on completion tokens only.

For a row with tokens x_0..x_{T-1} and loss mask m_t (1 where x_t is a completion token):

    nll_sum(row) = sum_{t=1}^{T-1} m_t * -log softmax(logits_{t-1})[x_t]
    count(row)   = sum_{t=1}^{T-1} m_t

An optimizer step's loss is sum(nll_sum) / sum(count) over every row of every forward in the
step — a token mean that does not depend on how the rows were split into forwards. Logits are
upcast to float32 before the log-softmax.

The per-row sum. By default it runs over the padded width T-1 (`nll.sum(dim=1)`): masked
positions add exact zeros, but how a vectorised sum groups the real terms depends on the width,
so padding can change the last bits of a row's sum. With `batch_invariant` it runs over the row's
own span — positions 0 .. (last completion target) — one row at a time: a row's sum is then the
same bits whatever the padded width and batch, and (for rows that end with their completion, as
every twinrun-encoded row does) the bits a batch of one gives. `batch_invariant=None` follows the
logits: those of a batch-invariant forward (`CausalLM` with `batch_invariant = True`) carry the
attribute `BATCH_INVARIANT_TAG`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BATCH_INVARIANT_TAG = "twinrun_batch_invariant"


def wants_invariant(logits: torch.Tensor, batch_invariant: bool | None) -> bool:
    """An explicit flag wins; None means "as the logits were made"."""
    if batch_invariant is not None:
        return batch_invariant
    return bool(getattr(logits, BATCH_INVARIANT_TAG, False))


def row_sums(values: torch.Tensor, mask: torch.Tensor, invariant: bool) -> torch.Tensor:
    """Per-row sums of `values` [B, N] (already zero where `mask` [B, N] is False) -> [B].

    Invariant: row b is summed over positions 0 .. last True of its mask, as a [1, span] tensor,
    so the result depends on the row alone."""
    if not invariant:
        return values.sum(dim=1)
    n = values.shape[1]
    ends = (mask.to(torch.int64) * torch.arange(1, n + 1, device=mask.device)).amax(dim=1)
    return torch.cat([values[b : b + 1, :end].sum(dim=1) for b, end in enumerate(ends.tolist())])


def completion_nll(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    batch_invariant: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row NLL sums over completion tokens ([B], float32) and per-row counts ([B], int64)."""
    b, t, v = logits.shape
    shift_logits = logits[:, :-1].float().reshape(-1, v)
    targets = input_ids[:, 1:].reshape(-1)
    mask = loss_mask[:, 1:].bool()
    nll = F.cross_entropy(shift_logits, targets, reduction="none").view(b, t - 1)
    nll = torch.where(mask, nll, torch.zeros((), dtype=nll.dtype))
    return row_sums(nll, mask, wants_invariant(logits, batch_invariant)), mask.sum(dim=1)
