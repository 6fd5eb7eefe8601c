"""Row gradients of batch-invariant mode: collected during a backward pass, added into `.grad`.

Autograd adds the gradients a parameter receives from several rows in the order its scheduler
reaches them, so a batch's sum would depend on the batch. Batch-invariant mode instead hands each
row's gradient here (`collect`, keyed by row index and forward order); an engine callback queued by
the first `collect` of a backward (`flush`) adds them into `.grad` row by row, the forwards of one
row first summed in forward order. Used by `twinrun.model.invariant` (per-row parameter aliases)
and `twinrun.model.packing` (per-row LoRA weight gradients of the packed forward).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

Entry = tuple[int, int, tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]


class _Pending:
    """Row gradients collected during one backward pass, flushed by an engine callback."""

    entries: list[Entry] = []
    queued = False
    forwards = itertools.count()
    apart: list[dict[int, torch.Tensor]] | None = None  # `rows_apart`: the rows, not `.grad`


@contextmanager
def rows_apart() -> Iterator[list[dict[int, torch.Tensor]]]:
    """Inside, a backward's row gradients are not added into `.grad`: each row's gradient (its
    forwards summed in forward order) is appended to the yielded list, in row order, as
    {id(param): gradient} — for a caller that adds the rows of several forwards in one order."""
    rows: list[dict[int, torch.Tensor]] = []
    _Pending.apart = rows
    try:
        yield rows
    finally:
        _Pending.apart = None


def flush() -> None:
    """Add the collected row gradients into `.grad`: row index by row index; for one row index
    the forwards' gradients are first summed in forward order, then added (as autograd adds the
    gradients of a parameter used by several forwards in one backward)."""
    entries = sorted(_Pending.entries, key=lambda e: (e[0], e[1]))
    _Pending.entries = []
    _Pending.queued = False
    touched: dict[int, torch.Tensor] = {}
    for _, group in itertools.groupby(entries, key=lambda e: e[0]):
        totals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for _, _, leaves, grads in group:
            for param, g in zip(leaves, grads, strict=True):
                if g is None:
                    continue
                key = id(param)
                totals[key] = (param, g if key not in totals else totals[key][1] + g)
        if _Pending.apart is not None:
            _Pending.apart.append({key: total.detach() for key, (_, total) in totals.items()})
            continue
        for param, total in totals.values():
            if param.grad is None:
                param.grad = total.detach().clone()
            else:
                param.grad.add_(total)
            touched[id(param)] = param
    for param in touched.values():  # as AccumulateGrad does, once per parameter and backward
        hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
        for hook in list(hooks.values()):
            hook(param)


def collect(
    row: int, order: int, leaves: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor | None, ...]
) -> None:
    """Hand over one row's gradients for `leaves` from the forward numbered `order`; the first
    call of a backward pass queues `flush` for its end."""
    if not _Pending.queued:
        torch.autograd.Variable._execution_engine.queue_callback(flush)
        _Pending.queued = True
    _Pending.entries.append((row, order, leaves, grads))


def new_forward() -> int:
    """The order of a new forward; drops what a backward that raised left behind."""
    if _Pending.entries or _Pending.queued:
        _Pending.entries, _Pending.queued = [], False
    return next(_Pending.forwards)
