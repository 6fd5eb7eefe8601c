"""`--spike-factor F --spike-window W`: a step whose loss exceeds F times the median of the last
W steps' losses is rerun from its pre-step state, on the same batch (the loop took it once),
with the generator restored and planted faults off. `intrinsic`: the rerun reproduces the loss,
gradients and generator state bit for bit — the data did it. `transient`: it does not —
nondeterminism did. Training continues with the rerun's gradients."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from twinrun.core.progress import Progress
from twinrun.train.loop import Hook, Recipe, StepContext


class SpikeHook(Hook):
    def __init__(
        self, recipe: Recipe, factor: float, window: int, progress: Progress | None
    ) -> None:
        self.recipe, self.factor, self.window, self.progress = recipe, factor, window, progress
        self.spikes: list[dict[str, Any]] = []

    def median_exceeded(self, ctx: StepContext, loss: float) -> float | None:
        """The median of the last W losses when `loss` exceeds F times it (else None)."""
        window = [m["loss"] for m in ctx.loop.metrics[-self.window :]]
        if len(window) < self.window:
            return None
        median = statistics.median(window)
        return median if loss > self.factor * median else None

    def at_boundary(self, ctx: StepContext) -> None:
        assert ctx.outcome is not None
        median = self.median_exceeded(ctx, ctx.outcome.loss)
        if median is None:
            return
        loss_a, grads_a, rng_a = ctx.outcome.loss, ctx.grads, torch.get_rng_state()
        torch.set_rng_state(ctx.rng_before)
        ctx.rerunning = True
        try:
            ctx.loop.compute(ctx, self.recipe)
        finally:
            ctx.rerunning = False
        assert ctx.outcome is not None
        loss_b = ctx.outcome.loss
        same = (
            loss_a == loss_b
            and torch.equal(rng_a, torch.get_rng_state())
            and all(torch.equal(a, b) for a, b in zip(grads_a, ctx.grads, strict=True))
        )
        kind = "intrinsic" if same else "transient"
        self.spikes.append({
            "step": ctx.step, "kind": kind, "loss": loss_a, "rerun_loss": loss_b,
            "median": median, "factor": self.factor,
        })  # fmt: skip
        ctx.outcome.metrics["spike"] = kind
        if self.progress is not None:
            self.progress.note(
                f"step {ctx.step}: loss {loss_a:.4f} > {self.factor} x median {median:.4f}; "
                f"rerun -> {loss_b:.4f}: {kind}"
            )
