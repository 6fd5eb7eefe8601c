"""The learning-rate schedule: linear warmup for `warmup_steps`, then cosine decay to exactly zero
at the last optimizer step.

    lr(s) = base * (s + 1) / W                                   for s < W
    lr(s) = base * 0.5 * (1 + cos(pi * (s - W) / (T - 1 - W)))    for W <= s < T - 1
    lr(T - 1) = 0.0

One exception: when only one step is left after warmup (T - 1 == W, e.g. a one-step run) there is
no room to decay, and that step uses `base` — a schedule that zeroes the only update would make
the run a no-op.
"""

from __future__ import annotations

import math

from twinrun.core.errors import ConfigError


def check_schedule(warmup_steps: int, total_steps: int) -> None:
    if total_steps < 1:
        raise ConfigError("the run has no optimizer step", "give at least one example and epoch")
    if warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {warmup_steps}")
    if warmup_steps >= total_steps:
        raise ConfigError(
            f"--warmup-steps {warmup_steps} leaves no step of the {total_steps}-step run to decay",
            f"use --warmup-steps below {total_steps}",
        )


def lr_at(step: int, base: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of a `total_steps`-step run."""
    check_schedule(warmup_steps, total_steps)
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} outside a {total_steps}-step run")
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    last = total_steps - 1
    if last == warmup_steps:
        return base
    if step == last:
        return 0.0
    progress = (step - warmup_steps) / (last - warmup_steps)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))
