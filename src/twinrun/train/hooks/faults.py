"""The planted faults that act on the step: `rng@K` draws once from the torch CPU generator
before step K; `reduction@K` runs each of step K's forwards' backward row by row, last row
first, so the gradient is summed in another order. Neither fires in a spike rerun."""

from __future__ import annotations

import torch

from twinrun.train.faults import Faults
from twinrun.train.loop import Forward, Hook, StepContext


class FaultHook(Hook):
    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def before_step(self, ctx: StepContext) -> None:
        if not ctx.rerunning and self.faults.at("rng", ctx.step):
            torch.rand(1)  # the stray draw: shifts the torch CPU generator

    def backward(self, ctx: StepContext, fw: Forward) -> bool:
        if ctx.rerunning or not self.faults.at("reduction", ctx.step) or fw.row_losses is None:
            return False
        rows = fw.row_losses
        for b in reversed(range(rows.shape[0])):
            rows[b].backward(retain_graph=b > 0)
        return True
