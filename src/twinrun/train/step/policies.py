"""The loop's step policies that are not its defaults (train/step/loop.py says where each acts):

- `ReductionFault`, the planted `reduction@K` fault: each of step K's forwards' backward runs
  row by row, last row first, so the gradient is summed in another order;
- `StrayDraw`, the planted `rng@K` fault: one draw from the torch CPU generator before step K;
- `SpikeRerun`, `--spike-factor F --spike-window W`: a step whose loss exceeds F times the median
  of the last W steps' losses is rerun from its pre-step state, on the same batch (the loop took
  it once), with the generator restored and planted faults off. `intrinsic`: the rerun
  reproduces the loss, gradients and generator state bit for bit — the data did it.
  `transient`: it does not — nondeterminism did. Training continues with the rerun's gradients.

Neither planted fault fires in a spike rerun.

- `RowParts`, batch-invariant mode: a forward's gradient is its rows' gradients apart, in row
  order (and, as one more part, whatever its backward accumulated into `.grad` the usual way —
  a reward head's), so the step's sum adds the same row gradients in the same order however
  the step's rows are split into forwards and the forwards into processes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from twinrun.core.progress import Progress
from twinrun.train.step.faults import Faults
from twinrun.train.step.loop import Attempt, Forward, Params, Parts


class ReductionFault:
    """The loop's backward with `reduction@K` planted (a plain backward at every other step)."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def run(self, step: int, fw: Forward, rerun: bool) -> None:
        if rerun or not self.faults.at("reduction", step) or fw.row_losses is None:
            fw.loss.backward()
            return
        rows = fw.row_losses
        for b in reversed(range(rows.shape[0])):
            rows[b].backward(retain_graph=b > 0)


class StrayDraw:
    """`rng@K`: before step K (a rerun does not start the step again), one stray draw."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def before_step(self, step: int) -> None:
        if self.faults.at("rng", step):
            torch.rand(1)  # shifts the torch CPU generator


class SpikeRerun:
    def __init__(self, factor: float, window: int, progress: Progress | None) -> None:
        self.factor, self.window, self.progress = factor, window, progress
        self.spikes: list[dict[str, Any]] = []

    def exceeded(self, history: Sequence[dict[str, Any]], loss: float) -> float | None:
        """The median of the last W losses when `loss` exceeds F times it (else None)."""
        window = [m["loss"] for m in history[-self.window :]]
        if len(window) < self.window:
            return None
        median = statistics.median(window)
        return median if loss > self.factor * median else None

    def judge(self, step: int, median: float, first: Attempt, rerun: Attempt) -> str:
        """`intrinsic` or `transient`, recorded in `spikes` (and said on the progress line)."""
        same = (
            first.loss == rerun.loss
            and torch.equal(first.rng_after, rerun.rng_after)
            and all(torch.equal(a, b) for a, b in zip(first.grads, rerun.grads, strict=True))
        )
        kind = "intrinsic" if same else "transient"
        self.spikes.append({
            "step": step, "kind": kind, "loss": first.loss, "rerun_loss": rerun.loss,
            "median": median, "factor": self.factor,
        })  # fmt: skip
        if self.progress is not None:
            self.progress.note(
                f"step {step}: loss {first.loss:.4f} > {self.factor} x median {median:.4f}; "
                f"rerun -> {rerun.loss:.4f}: {kind}"
            )
        return kind


class RowParts:
    """The loop's `parts` in batch-invariant mode (see the module docstring)."""

    def run(self, backward: Callable[[], None], params: Params) -> Parts:
        from twinrun.model.row_gradients import rows_apart

        with rows_apart() as rows:
            backward()
        parts: Parts = [[row.get(id(p)) for _, p in params] for row in rows]
        rest = [p.grad for _, p in params]
        if any(g is not None for g in rest):
            parts.append(rest)
        return parts
