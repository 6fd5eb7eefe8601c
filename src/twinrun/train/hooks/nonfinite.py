"""A non-finite loss or gradient stops the run at the optimizer boundary, before AdamW would
spread it into every parameter: the state after the last good step is written as a checkpoint
(`--resume` continues from it once the cause is fixed), then a one-line error."""

from __future__ import annotations

import math

import torch

from twinrun.core.errors import TwinrunError
from twinrun.train.hooks.checkpoint import Checkpointer
from twinrun.train.step.loop import Hook, Phase, StepView


class NonFiniteError(TwinrunError, ArithmeticError):
    """The loss or a gradient of a step is NaN or infinite."""


class NonFiniteHook(Hook):
    points = {"at_boundary": Phase.CHECK}  # before the boundary's records: capture, digests

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer

    def at_boundary(self, view: StepView) -> None:
        loss = view.outcome.loss
        bad = [] if math.isfinite(loss) else [f"loss {loss}"]
        if not all(bool(torch.isfinite(g).all()) for g in view.grads):
            bad.append("gradient")
        if not bad:
            return
        where = "no checkpoint (it was the first step)"
        if view.step > 0:
            if not self.checkpointer.exists(view.step):
                self.checkpointer.write(view, view.step, view.rng_before)
            where = f"checkpoint of the {view.step} good steps written"
        raise NonFiniteError(
            f"step {view.step}: non-finite {' and '.join(bad)}; {where}",
            "lower --learning-rate (or check the data of this step)",
        )
