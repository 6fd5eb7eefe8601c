"""Supervised fine-tuning loss: next-token negative log-likelihood on completion tokens only.

For a row with tokens x_0..x_{T-1} and loss mask m_t (1 where x_t is a completion token):

    nll_sum(row) = sum_{t=1}^{T-1} m_t * -log softmax(logits_{t-1})[x_t]
    count(row)   = sum_{t=1}^{T-1} m_t

An optimizer step's loss is sum(nll_sum) / sum(count) over every row of every forward in the
step — a token mean that does not depend on how the rows were split into forwards. Logits are
upcast to float32 before the log-softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def completion_nll(
    logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row NLL sums over completion tokens ([B], float32) and per-row counts ([B], int64)."""
    b, t, v = logits.shape
    shift_logits = logits[:, :-1].float().reshape(-1, v)
    targets = input_ids[:, 1:].reshape(-1)
    mask = loss_mask[:, 1:].bool()
    nll = F.cross_entropy(shift_logits, targets, reduction="none").view(b, t - 1)
    nll = torch.where(mask, nll, torch.zeros((), dtype=nll.dtype))
    return nll.sum(dim=1), mask.sum(dim=1)
