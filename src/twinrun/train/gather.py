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

import torch

from twinrun.train.distributed import _dist, collective, interleave, world
from twinrun.train.loop import Grads, Params, sum_in_forward_order


class OrderedGather:
    """Every process's per-forward gradients in global forward order, summed (every process
    gets the same sum)."""

    def __init__(self) -> None:
        self.bytes_sent = 0  # this process's contribution to the last step's gather

    def combine(self, params: Params, per_forward: list[Grads]) -> list[torch.Tensor]:
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


def gather_gradients(params: Params, per_forward: list[Grads]) -> tuple[list[Grads], int]:
    """Every process's per-forward gradients in global forward order, and the bytes this process
    sent. A process with no forward in the step still takes part (it sends padding rows)."""
    size = world().size
    if size == 1:
        return per_forward, 0
    dist = _dist()
    device = params[0][1].device
    width = sum(p.numel() * p.element_size() for _, p in params) + len(params)
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(size)]
    with collective("counting each process's forwards"):
        dist.all_gather(counts, torch.tensor([len(per_forward)], device=device))
    most = max(int(c.item()) for c in counts)
    rows = torch.zeros((most, width), dtype=torch.uint8, device=device)
    for k, grads in enumerate(per_forward):
        rows[k] = pack(params, grads)
    gathered = [torch.empty_like(rows) for _ in range(size)]
    if most:
        with collective("gathering the forwards' gradients"):
            dist.all_gather(gathered, rows)
    per_rank = [list(g[: int(c.item())]) for g, c in zip(gathered, counts, strict=True)]
    return [unpack(params, row) for row in interleave(per_rank)], rows.numel()
