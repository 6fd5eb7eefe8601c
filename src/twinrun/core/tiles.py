"""Tensors laid end to end in one buffer ("tiled"), and finding that buffer again.

The LoRA parameters, their summed gradients and both Adam moments are each many small tensors
of one dtype. Kept as views of one buffer per kind (in parameter order), every kind is already
one contiguous span: `--diag` checksums and hashes each in a few passes, with no copy and no
per-tensor work. Every elementwise operation still runs on each tensor apart, over the same
contiguous elements in the same order, so the bytes are those of separate tensors.

* `tiled_zeros(like)` — zeros shaped like each tensor of `like`, views of one new buffer;
* `tiled(tensors)` — copies of `tensors`, views of one new buffer;
* `tile_parameters(params)` — the parameters' data moved into one buffer (values kept);
* `span(parts)` — one 1-D tensor over the memory `parts` tile, in order and end to end (any
  tensors of one storage laid out so, wherever they came from), or None.

Tensors of mixed dtypes or devices, or not contiguous, are not tiled: each gets its own tensor,
as `torch.zeros_like` / `clone` would give it, and `span` of them is None.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["span", "tile_parameters", "tiled", "tiled_zeros"]


def _tileable(tensors: Sequence[torch.Tensor]) -> bool:
    if not tensors:
        return False
    first = tensors[0]
    return all(
        t.dtype == first.dtype and t.device == first.device and t.is_contiguous() for t in tensors
    )


def _views(buf: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out, start = [], 0
    for t in like:
        n = t.numel()
        out.append(buf[start : start + n].view(t.shape))
        start += n
    return out


def tiled_zeros(like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Zeros shaped like each of `like` (its dtype and device), views of one buffer."""
    if not _tileable(like):
        return [torch.zeros_like(t) for t in like]
    first = like[0]
    buf = torch.zeros(sum(t.numel() for t in like), dtype=first.dtype, device=first.device)
    return _views(buf, like)


def tiled(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (detached), views of one buffer."""
    if not _tileable(tensors):
        return [t.detach().clone() for t in tensors]
    with torch.no_grad():
        buf = torch.cat([t.detach().reshape(-1) for t in tensors])
    return _views(buf, tensors)


def tile_parameters(params: Sequence[torch.nn.Parameter]) -> None:
    """Move the parameters' data into one buffer, in order (the same values; the Parameter
    objects, their names and their `requires_grad` stay)."""
    if not _tileable(params):
        return
    for p, view in zip(params, tiled(params), strict=True):
        p.data = view


def span(parts: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """A 1-D tensor (detached) over exactly the memory of `parts` when they are contiguous
    tensors of one dtype and one storage, each starting where the one before ends; else None.
    Two tensors of one storage bound every address between them to it, so checking the ends'
    storage and every part's address suffices."""
    if not parts:
        return None
    first, last = parts[0], parts[-1]
    dtype, size = first.dtype, first.element_size()
    at = first.data_ptr()
    n = 0
    for p in parts:
        if p.dtype != dtype or p.data_ptr() != at or not p.is_contiguous():
            return None
        k = p.numel()
        at += k * size
        n += k
    if len(parts) > 1 and (
        first.untyped_storage().data_ptr() != last.untyped_storage().data_ptr()
        or first.device != last.device
    ):
        return None
    return torch.as_strided(first.detach(), (n,), (1,))
