"""`--trace-step K`: per-module checksums of step K's forwards and backwards (diag/trace.py),
opened before the step and closed at the optimizer boundary, once the gradients are summed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinrun.train.loop import Hook, StepContext


class TraceHook(Hook):
    def __init__(self, model: Any, path: Path, step: int) -> None:
        self.model, self.path, self.step = model, path, step
        self.open: Any = None

    def before_step(self, ctx: StepContext) -> None:
        if ctx.step == self.step:
            from twinrun.diag.trace import StepTrace

            self.open = StepTrace(self.model, self.path, ctx.step).__enter__()

    def at_boundary(self, ctx: StepContext) -> None:
        if self.open is not None:
            trace, self.open = self.open, None
            trace.__exit__(None, None, None)

    def close(self) -> None:
        """A step that raised leaves its trace unwritten."""
        if self.open is not None:
            trace, self.open = self.open, None
            trace.__exit__(RuntimeError, None, None)
