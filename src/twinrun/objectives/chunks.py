"""The output head and a per-position function on chunks of positions (`by_chunks`): pure torch,
no model. `model.head_chunks` says when a forward takes it and what it chunks (see there)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

HEAD_CHUNK = 512  # positions per chunk of the output head and its loss


def by_chunks(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    per_position: Callable[..., torch.Tensor],
    targets: torch.Tensor,
    dim: int,
    extra: tuple[Any, ...] = (),
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> torch.Tensor:
    """`per_position(head(hidden), targets, *extra)` computed `HEAD_CHUNK` positions at a time
    along `dim` of `hidden` (`targets` cut alike) and concatenated along `dim`; the head runs
    under `autocast`. `per_position` must treat each position alone, and return one value per
    position. With a gradient, each chunk runs under non-reentrant checkpointing: its logits are
    made again in the backward."""
    n = hidden.shape[dim]
    grad = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, max(n, 1), HEAD_CHUNK):  # no position: one empty chunk
        size = min(HEAD_CHUNK, n - start)
        h, y = hidden.narrow(dim, start, size), targets.narrow(dim, start, size)
        if not grad:
            parts.append(head_then(head, per_position, autocast, h, y, *extra))
            continue
        from torch.utils.checkpoint import checkpoint

        part = checkpoint(head_then, head, per_position, autocast, h, y, *extra,
                          use_reentrant=False)  # fmt: skip
        assert isinstance(part, torch.Tensor)
        parts.append(part)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def head_then(
    head: Callable[[torch.Tensor], torch.Tensor],
    per_position: Callable[..., torch.Tensor],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *extra: Any,
) -> torch.Tensor:
    """One chunk: the head on its hidden states, then `per_position` on its logits."""
    with autocast():
        logits = head(hidden)
    return per_position(logits, targets, *extra)
