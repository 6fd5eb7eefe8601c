"""Batching: `--batch-size` rows per forward, right-padded, with every padded key
masked out of every real query (the model does that from `attention_mask`); `--accumulation`
forwards per optimizer step. The per-epoch order comes from `stream(seed, "shuffle", epoch)`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from twinrun.core.rng import stream
from twinrun.data.examples import EncodedRow

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step: its index, epoch, and the example indices of each forward."""

    step: int
    epoch: int
    forwards: tuple[tuple[int, ...], ...]

    @property
    def indices(self) -> list[int]:
        return [i for fw in self.forwards for i in fw]


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    return stream(seed, "shuffle", epoch).permutation(n)


def steps_per_epoch(n: int, batch_size: int, accumulation: int) -> int:
    return math.ceil(math.ceil(n / batch_size) / accumulation)


def plan_steps(
    n: int, epochs: int, batch_size: int, accumulation: int, seed: int
) -> list[StepPlan]:
    """Every optimizer step of the run. The last forward of an epoch may be short, and so may
    the last step (fewer forwards); no example is dropped or repeated within an epoch."""
    plans: list[StepPlan] = []
    for epoch in range(epochs):
        order = epoch_order(seed, epoch, n)
        forwards = [tuple(order[i : i + batch_size]) for i in range(0, n, batch_size)]
        for j in range(0, len(forwards), accumulation):
            plans.append(StepPlan(len(plans), epoch, tuple(forwards[j : j + accumulation])))
    return plans


def pad_rows(
    rows: list[EncodedRow], pad_id: int, length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad rows to one length: (input_ids, attention_mask, loss_mask), each [B, T]."""
    import torch

    width = max(len(r.input_ids) for r in rows) if length is None else length
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    loss = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        t = len(r.input_ids)
        ids[b, :t] = torch.tensor(r.input_ids, dtype=torch.long)
        attn[b, :t] = 1
        loss[b, :t] = torch.tensor(r.loss_mask, dtype=torch.long)
    return ids, attn, loss


def padding_fraction(rows: list[EncodedRow]) -> float:
    width = max(len(r.input_ids) for r in rows)
    real = sum(len(r.input_ids) for r in rows)
    return 1.0 - real / (width * len(rows))
