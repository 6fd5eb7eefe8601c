"""The ordered gradient gather of a data-parallel run (the loop's `combine` policy there).

Each process computed the LoRA gradients of its own forwards (forward i on rank i % world). This
policy all-gathers every forward's gradients as raw bytes, with one byte per parameter saying
whether the forward reached it, puts them in global forward order and sums them from zero,
forward 0 first — the very additions one process makes — so the summed gradient has the same
bits on any number of processes.

A plain all-reduce would move 1x the gradient bytes per process instead of the forwards' count
times, but it sums in an order the backend picks (and per-process partial sums first), which
changes the bits with the process count. bench/distributed.py measures both.
"""

from __future__ import annotations

from typing import Any

import torch

from twinrun.train.parallel.distributed import _dist, collective, interleave, world
from twinrun.train.step.loop import Grads, Params, Parts, sum_in_forward_order


class OrderedGather:
    """Every process's per-forward gradients in global forward order, summed (every process
    gets the same sum)."""

    def __init__(self) -> None:
        self.bytes_sent = 0  # this process's contribution to the last step's gather

    def combine(self, params: Params, per_forward: list[Parts]) -> list[torch.Tensor]:
        gathered, self.bytes_sent = gather_gradients(params, per_forward)
        return sum_in_forward_order(params, gathered)


def pack(params: Params, grads: Grads) -> torch.Tensor:
    """One forward's gradients as bytes: each parameter's gradient (zeros where None), then one
    presence byte per parameter."""
    parts, present = [], []
    for (_, p), g in zip(params, grads, strict=True):
        if g is None:
            size = p.numel() * p.element_size()
            parts.append(torch.zeros(size, dtype=torch.uint8, device=p.device))
        else:
            parts.append(g.detach().contiguous().view(-1).view(torch.uint8))
        present.append(g is not None)
    flags = torch.tensor(present, dtype=torch.uint8, device=parts[0].device if parts else "cpu")
    return torch.cat([*parts, flags])


def unpack(params: Params, row: torch.Tensor) -> Grads:
    """The inverse of `pack`: per parameter its gradient (a fresh tensor) or None."""
    flags = row[-len(params) :].tolist() if params else []
    out: Grads = []
    start = 0
    for (_, p), there in zip(params, flags, strict=True):
        n = p.numel() * p.element_size()
        if there:
            out.append(row[start : start + n].clone().view(p.dtype).view(p.shape))
        else:
            out.append(None)
        start += n
    return out


def gather_gradients(params: Params, per_forward: list[Parts]) -> tuple[list[Parts], int]:
    """Every process's per-forward gradients (each forward's parts: one, or a row each in
    batch-invariant mode) in global forward order, and the bytes this process sent. A process
    with no forward in the step still takes part (it sends padding rows)."""
    size = world().size
    if size == 1:
        return per_forward, 0
    dist = _dist()
    device = params[0][1].device
    width = sum(p.numel() * p.element_size() for _, p in params) + len(params)
    shapes: list[Any] = [None] * size  # per process: its forwards' numbers of parts
    with collective("counting each process's forwards"):
        dist.all_gather_object(shapes, [len(parts) for parts in per_forward])
    most = max(sum(shape) for shape in shapes)
    rows = torch.zeros((most, width), dtype=torch.uint8, device=device)
    for k, grads in enumerate(g for parts in per_forward for g in parts):
        rows[k] = pack(params, grads)
    gathered = [torch.empty_like(rows) for _ in range(size)]
    if most:
        with collective("gathering the forwards' gradients"):
            dist.all_gather(gathered, rows)
    per_rank = []
    for block, shape in zip(gathered, shapes, strict=True):
        unpacked = iter([unpack(params, row) for row in block[: sum(shape)]])
        per_rank.append([[next(unpacked) for _ in range(n)] for n in shape])
    return interleave(per_rank), rows.numel()
