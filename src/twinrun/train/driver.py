"""Drive a Loop over a run's steps: resume from the newest checkpoint, write checkpoints every
N steps, close what the loop opened. Shared by every objective."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.config.run import shaping_numbers
from twinrun.core.errors import ConfigError
from twinrun.core.fileio import atomic_write_text
from twinrun.train.checkpoint import check_same_run, newest_checkpoint, restore, write_checkpoint
from twinrun.train.loop import Loop, StepOutcome
from twinrun.train.session import Session

LOGS = ("diag.jsonl", "trace.jsonl")


@dataclass
class ObjectiveState:
    """Objective state a checkpoint carries beyond parameters and optimizer (e.g. GRPO's
    replay buffer): JSON-able get/set."""

    get: Callable[[], dict[str, Any]]
    set: Callable[[dict[str, Any]], None]


def resume_point(out: Path) -> int:
    """Steps done by the newest complete checkpoint of `out` (an error when there is none)."""
    ckpt = newest_checkpoint(out)
    if ckpt is None:
        raise ConfigError(
            f"--resume: {out} has no complete checkpoint",
            "start the run without --resume (and with --checkpoint-every to make checkpoints)",
        )
    return ckpt.steps_done


def truncate_logs(out: Path, steps_done: int) -> None:
    """Keep only the train rows of steps before `steps_done` in diag/trace logs (a killed run
    may have logged steps past its last checkpoint)."""
    for name in LOGS:
        path = out / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line from the kill
            if row.get("phase", "train") != "train" or int(row.get("step", -1)) < steps_done:
                kept.append(line)
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def drive(
    s: Session,
    loop: Loop,
    total: int,
    step_fn_for: Callable[[int], Callable[[], StepOutcome]],
    objective_state: ObjectiveState | None = None,
) -> None:
    cfg = s.cfg
    start = 0
    shaping = shaping_numbers(cfg)
    if cfg.resume:
        ckpt = newest_checkpoint(s.out)
        assert ckpt is not None  # checked when the session opened
        check_same_run(ckpt.state["train"], shaping)
        restore(ckpt, loop.params, loop.optimizer)
        loop.metrics = list(ckpt.state["metrics"])
        if objective_state is not None:
            objective_state.set(ckpt.state.get("objective", {}))
        start = ckpt.steps_done
        if loop.progress is not None:
            loop.progress.note(f"resuming {s.out} after step {start - 1} ({ckpt.path.name})")
    every = cfg.checkpoint_every or 0
    try:
        for step in range(start, total):
            loop.run_step(step, step_fn_for(step))
            done = step + 1
            if every and done % every == 0 and done < total:
                write_checkpoint(s.out, done, loop.params, loop.optimizer, {
                    "train": shaping,
                    "metrics": loop.metrics,
                    "objective": objective_state.get() if objective_state else {},
                })  # fmt: skip
    finally:
        if loop.progress is not None:
            loop.progress.close()
        if loop.recorder is not None:
            loop.recorder.close()
