"""Replay timings: the step's forward, backward and optimizer seconds (as the loop measured
them) and the wall time of the update, into the metrics row."""

from __future__ import annotations

from typing import Any

from twinrun.train.loop import Hook, StepContext


class TimingHook(Hook):
    def after_step(self, ctx: StepContext, row: dict[str, Any]) -> None:
        row.update(ctx.timings)
        row["local_train_wall_s"] = row["wall_s"]
