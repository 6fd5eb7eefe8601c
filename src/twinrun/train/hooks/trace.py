"""`--trace-step K`: per-module checksums of step K's forwards and backwards (diag/trace.py),
opened before the step and closed once its gradients are combined (a spike rerun of the step is
not traced)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from twinrun.train.step.loop import Hook, Phase, StepView

if TYPE_CHECKING:
    from twinrun.diag.trace import StepTrace
    from twinrun.model.build import CausalLM


class TraceHook(Hook):
    points = {"before_step": Phase.RECORD, "computed": Phase.RECORD}

    def __init__(self, model: CausalLM, path: Path, step: int) -> None:
        self.model, self.path, self.step = model, path, step
        self.open: StepTrace | None = None

    def before_step(self, view: StepView) -> None:
        if view.step == self.step:
            from twinrun.diag.trace import StepTrace

            self.open = StepTrace(self.model, self.path, view.step).__enter__()

    def computed(self, view: StepView) -> None:
        if self.open is not None:
            trace, self.open = self.open, None
            trace.__exit__(None, None, None)

    def close(self) -> None:
        """A step that raised leaves its trace unwritten."""
        if self.open is not None:
            trace, self.open = self.open, None
            trace.__exit__(RuntimeError, None, None)
