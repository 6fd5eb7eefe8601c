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

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from twinrun.objectives.chunks import by_chunks

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


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each position's NLL of its target: logits [..., V] (upcast to float32), targets [...] ->
    float32 [...] — `completion_nll`'s per-token values, position by position."""
    v = logits.shape[-1]
    nll = F.cross_entropy(logits.float().reshape(-1, v), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape)


def chunked_completion_nll(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    batch_invariant: bool,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_nll(head(hidden), ...)` without the [B, T, V] logits: the output layer and
    the token NLLs run on `HEAD_CHUNK` positions at a time (`objectives.chunks.by_chunks`, each
    chunk's logits recomputed in the backward, never kept), so the loss costs memory for one
    chunk's logits, not T x vocabulary. Each position's logits and NLL are computed as the whole
    forward computes them (an output-layer product per token row, a log-softmax per row): in
    portable mode the exact products give a row the same bits in a chunk as in the whole, so
    the sums are those `completion_nll` gives on the same hidden states."""
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    nll = by_chunks(hidden[:, :-1], head, token_nll, targets, dim=1, autocast=autocast)
    nll = torch.where(mask, nll, torch.zeros((), dtype=nll.dtype))
    return row_sums(nll, mask, batch_invariant), mask.sum(dim=1)
