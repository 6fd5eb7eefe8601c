"""Row gradients of batch-invariant mode: collected during a backward pass, added into `.grad`.

Autograd adds the gradients a parameter receives from several rows in the order its scheduler
reaches them, so a batch's sum would depend on the batch. Batch-invariant mode instead hands each
row's gradient here, keyed by row index and forward order: one row at a time (`collect`, the
per-row parameter aliases of `twinrun.model.invariant`) or a forward's rows at once, stacked
(`collect_rows`, the LoRA weight gradients of `twinrun.model.packing`'s packed forward). An
engine callback queued by the first collect of a backward (`flush`) adds them into `.grad` row by
row, the forwards of one row first summed in forward order. Stacked rows are summed and added as
the same tensor operations on whole stacks (elementwise, so each row's bits are those of adding
it alone); a parameter that gets both kinds in one backward has its stacks taken apart first.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch

Entry = tuple[int, int, int, tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]
Stack = tuple[int, int, torch.Tensor, torch.Tensor]  # (order, seq, leaf, [rows, *leaf.shape])
Totals = dict[int, tuple[torch.Tensor, torch.Tensor]]  # id(leaf) -> (leaf, gradient)


class _Pending:
    """Row gradients collected during one backward pass, flushed by an engine callback."""

    entries: list[Entry] = []  # (row, order, seq, leaves, grads)
    stacks: list[Stack] = []
    queued = False
    forwards = itertools.count()
    seq = itertools.count()  # collection order (the hooks' order follows it)
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


def _row_totals(entries: list[Entry]) -> dict[int, Totals]:
    """Per row index (ascending), each leaf's gradient: the row's forwards summed in order."""
    out: dict[int, Totals] = {}
    for row, group in itertools.groupby(sorted(entries, key=lambda e: e[:3]), key=lambda e: e[0]):
        totals: Totals = {}
        for *_, leaves, grads in group:
            for param, g in zip(leaves, grads, strict=True):
                if g is None:
                    continue
                key = id(param)
                totals[key] = (param, g if key not in totals else totals[key][1] + g)
        out[row] = totals
    return out


def _stack_totals(stacks: list[Stack]) -> Totals:
    """Each stacked leaf's rows [R, ...]: its forwards' stacks summed in forward order (a
    forward with fewer rows adds to the rows it has)."""
    out: Totals = {}
    for _, _, leaf, rows in sorted(stacks, key=lambda s: s[:2]):
        key = id(leaf)
        if key not in out:
            out[key] = (leaf, rows)
            continue
        had = out[key][1]
        if had.shape[0] == rows.shape[0]:
            out[key] = (leaf, had + rows)
        else:
            n = min(had.shape[0], rows.shape[0])
            longer = had if had.shape[0] > n else rows
            out[key] = (leaf, torch.cat([had[:n] + rows[:n], longer[n:]]))
    return out


def add_rows_into_grad(param: torch.Tensor, rows: torch.Tensor) -> None:
    """Add rows[0], rows[1], ... into `.grad` one after the other (the first cloned into a
    missing `.grad`): `index_add_` with every index 0 adds its source rows in index order, the
    bits of one `add_` per row in one op (tests/unit/model/test_row_gradients.py holds it to
    that)."""
    rows = rows.detach()
    if param.grad is None:
        param.grad = rows[0].clone()
        rows = rows[1:]
    if rows.shape[0]:
        param.grad.unsqueeze(0).index_add_(0, _zeros(rows.shape[0], rows.device), rows)


@functools.cache
def _zeros(n: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.long, device=device)


def _take_apart_shared(
    entries: list[Entry], stacks: list[Stack]
) -> tuple[list[Entry], list[Stack]]:
    """The entries and stacks to add: when a leaf is in both kinds, every stack taken apart into
    row entries (so each parameter's rows are summed one way)."""
    by_row = {id(p) for e in entries for p in e[3]}
    if not any(id(leaf) in by_row for _, _, leaf, _ in stacks):
        return entries, stacks
    entries = entries + [
        (row, order, seq, (leaf,), (g,))
        for order, seq, leaf, rows in stacks
        for row, g in enumerate(rows.unbind(0))
    ]
    return entries, []


def _append_rows(
    apart: list[dict[int, torch.Tensor]], per_row: dict[int, Totals], stacked: Totals
) -> None:
    """`rows_apart`: each row's gradients, in row order, appended to `apart` instead of `.grad`."""
    count = max((len(rows) for _, rows in stacked.values()), default=0)
    for row in sorted(set(per_row) | set(range(count))):
        got = {key: total.detach() for key, (_, total) in per_row.get(row, {}).items()}
        for key, (_, rows) in stacked.items():
            if row < rows.shape[0]:
                got[key] = rows[row].detach()
        apart.append(got)


def _add_into_grads(per_row: dict[int, Totals], stacked: Totals) -> None:
    """Each row's totals, then each stack's rows, added into `.grad` (cloned into a missing one)."""
    for totals in per_row.values():
        for param, total in totals.values():
            if param.grad is None:
                param.grad = total.detach().clone()
            else:
                param.grad.add_(total)
    for param, rows in stacked.values():
        add_rows_into_grad(param, rows)


def flush() -> None:
    """Add the collected row gradients into `.grad`: row index by row index; for one row index
    the forwards' gradients are first summed in forward order, then added (as autograd adds the
    gradients of a parameter used by several forwards in one backward)."""
    entries, stacks = _Pending.entries, _Pending.stacks
    _Pending.entries, _Pending.stacks, _Pending.queued = [], [], False
    entries, stacks = _take_apart_shared(entries, stacks)
    per_row = _row_totals(entries)
    stacked = _stack_totals(stacks)
    if _Pending.apart is not None:
        _append_rows(_Pending.apart, per_row, stacked)
        return
    _add_into_grads(per_row, stacked)
    for param in _first_seen(entries, stacks):  # as AccumulateGrad does, once per parameter
        hooks = getattr(param, "_post_accumulate_grad_hooks", None) or {}
        for hook in list(hooks.values()):
            hook(param)


def _first_seen(entries: list[Entry], stacks: list[Stack]) -> list[torch.Tensor]:
    """The parameters given a gradient, in the order they first appear among the row gradients
    (row index, forward order, collection order; a stack is at its row 0)."""
    first: dict[int, tuple[tuple[int, int, int], torch.Tensor]] = {}

    def seen(at: tuple[int, int, int], param: torch.Tensor) -> None:
        if id(param) not in first or first[id(param)][0] > at:
            first[id(param)] = (at, param)

    for row, order, seq, leaves, grads in entries:
        for param, g in zip(leaves, grads, strict=True):
            if g is not None:
                seen((row, order, seq), param)
    for order, seq, leaf, _ in stacks:
        seen((0, order, seq), leaf)
    return [param for _, param in sorted(first.values(), key=lambda v: v[0])]


def _queue() -> int:
    """Queue `flush` for the end of this backward pass (once); the next collection number."""
    if not _Pending.queued:
        torch.autograd.Variable._execution_engine.queue_callback(flush)
        _Pending.queued = True
    return next(_Pending.seq)


def collect(
    row: int, order: int, leaves: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor | None, ...]
) -> None:
    """Hand over one row's gradients for `leaves` from the forward numbered `order`; the first
    call of a backward pass queues `flush` for its end."""
    _Pending.entries.append((row, order, _queue(), leaves, grads))


def collect_rows(order: int, leaf: torch.Tensor, rows: torch.Tensor) -> None:
    """Hand over the gradients of `leaf` from every row of the forward numbered `order` at once:
    `rows[i]` is row i's (rows 0 to R-1, each row's own gradient)."""
    _Pending.stacks.append((order, _queue(), leaf, rows))


def new_forward() -> int:
    """The order of a new forward; drops what a backward that raised left behind."""
    if _Pending.entries or _Pending.stacks or _Pending.queued:
        _Pending.entries, _Pending.stacks, _Pending.queued = [], [], False
    return next(_Pending.forwards)
