"""`--checkpoint-every N`: after every N-th step (not the last: the run's outputs follow it) a
complete checkpoint of the run (train/outputs/checkpoint.py), objective state included."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from twinrun.train.outputs.checkpoint import checkpoint_dir, write_checkpoint
from twinrun.train.step.loop import Hook, Phase, StepView


@dataclass
class ObjectiveState:
    """Objective state a checkpoint carries beyond parameters and optimizer (e.g. GRPO's
    prioritized replay buffer): JSON-able get/set."""

    get: Callable[[], dict[str, Any]]
    set: Callable[[dict[str, Any]], None]


@dataclass
class Checkpointer:
    """Writes the checkpoint of `steps_done` steps of this run."""

    out: Path
    shaping: dict[str, Any]
    objective: ObjectiveState | None = None
    flush: Sequence[Hook] = field(default_factory=list)  # the run's hooks, flushed first

    def write(self, view: StepView, steps_done: int, rng_state: torch.Tensor | None = None) -> Path:
        """The loop's state after `steps_done` steps, with the metrics rows written so far."""
        for hook in self.flush:  # the logs cover every step the checkpoint holds
            hook.flush()
        return write_checkpoint(
            self.out, steps_done, list(view.params), view.optimizer,
            {"train": self.shaping, "metrics": list(view.history),
             "objective": self.objective.get() if self.objective else {}},
            rng_state,
        )  # fmt: skip

    def exists(self, steps_done: int) -> bool:
        return checkpoint_dir(self.out, steps_done).is_dir()


class CheckpointHook(Hook):
    points = {"after_step": Phase.PERSIST}  # the row complete: a checkpoint holds eval numbers

    def __init__(self, checkpointer: Checkpointer, every: int) -> None:
        self.checkpointer, self.every = checkpointer, every

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        done = view.step + 1
        if done % self.every == 0 and done < view.total_steps:
            self.checkpointer.write(view, done)
