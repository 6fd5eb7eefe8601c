"""The learning-rate schedules: linear warmup for `warmup_steps` (W), then, over the rest of a
`total_steps`-step (T) run, one of

    cosine     lr(s) = base * 0.5 * (1 + cos(pi * (s - W) / (T - 1 - W)))   for W <= s < T - 1
               lr(T - 1) = 0.0
    wsd        warmup, stable, decay: lr(s) = base for W <= s < T - D, then a linear decay over
               the last D = `decay_steps` steps, lr(s) = base * (T - 1 - s) / D, which is exactly
               zero at the last step
    constant   lr(s) = base for s >= W
    linear     lr(s) = base * (T - s) / (T - W) for s >= W: transformers' (and so TRL's) linear
               schedule after its warmup, which ends one step short of zero, at base / (T - W)

and for all four, during warmup, lr(s) = base * (s + 1) / W.

One exception (cosine): when only one step is left after warmup (T - 1 == W, e.g. a one-step run)
there is no room to decay, and that step uses `base` — a schedule that zeroes the only update
would make the run a no-op. wsd states its decay length, so it has no such exception: the steps
of the decay are the steps named, and the warmup and the decay may not overlap.
"""

from __future__ import annotations

import math

from twinrun.config.run import SCHEDULES
from twinrun.core.errors import ConfigError

__all__ = ["SCHEDULES", "check_schedule", "lr_at", "warmup_of"]


def warmup_of(warmup_steps: int | None, warmup_ratio: float | None, total_steps: int) -> int:
    """The warm-up steps of a `total_steps`-step run: `--warmup-steps`, or `--warmup-ratio`'s
    ceil(ratio x steps) (transformers' `get_warmup_steps`). Both given must agree."""
    if warmup_ratio is None:
        if warmup_steps is None:  # validation requires one of them: a bug in twinrun
            raise RuntimeError("a run with neither --warmup-steps nor --warmup-ratio")
        return warmup_steps
    made = math.ceil(total_steps * warmup_ratio)
    if warmup_steps is not None and warmup_steps != made:
        raise ConfigError(
            f"--warmup-steps {warmup_steps} and --warmup-ratio {warmup_ratio} disagree: "
            f"{warmup_ratio} of the {total_steps}-step run is {made} step(s)",
            "give one of them",
        )
    return made


def check_schedule(
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    decay_steps: int | None = None,
) -> None:
    """ConfigError (one line) when the schedule cannot be laid over a `total_steps`-step run."""
    if total_steps < 1:
        raise ConfigError("the run has no optimizer step", "give at least one example and epoch")
    if schedule not in SCHEDULES:
        raise ConfigError(
            f"--lr-schedule must be one of {', '.join(SCHEDULES)}", "cosine is the usual choice"
        )
    if warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be >= 0, got {warmup_steps}")
    if warmup_steps >= total_steps:
        raise ConfigError(
            f"--warmup-steps {warmup_steps} leaves no step of the {total_steps}-step run to decay",
            f"use --warmup-steps below {total_steps}",
        )
    if schedule != "wsd":
        if decay_steps is not None:
            raise ConfigError(
                f"--decay-steps applies to --lr-schedule wsd, not {schedule}",
                "drop --decay-steps",
            )
        return
    if decay_steps is None:
        raise ConfigError("--lr-schedule wsd needs --decay-steps", "give --decay-steps N")
    if decay_steps < 1:
        raise ConfigError(f"--decay-steps must be >= 1, got {decay_steps}")
    if warmup_steps + decay_steps > total_steps:
        raise ConfigError(
            f"--warmup-steps {warmup_steps} + --decay-steps {decay_steps} exceed the "
            f"{total_steps}-step run",
            f"make them sum to at most {total_steps}",
        )


def lr_at(
    step: int,
    base: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "cosine",
    decay_steps: int | None = None,
) -> float:
    """The learning rate of optimizer step `step` (0-based) of a `total_steps`-step run."""
    check_schedule(warmup_steps, total_steps, schedule, decay_steps)
    if not 0 <= step < total_steps:
        raise ValueError(f"step {step} outside a {total_steps}-step run")
    if step < warmup_steps:
        return base * (step + 1) / warmup_steps
    last = total_steps - 1
    if schedule == "constant":
        return base
    if schedule == "linear":
        return base * (total_steps - step) / (total_steps - warmup_steps)
    if schedule == "wsd":
        assert decay_steps is not None
        if step < total_steps - decay_steps:
            return base
        return base * (last - step) / decay_steps
    if last == warmup_steps:
        return base
    if step == last:
        return 0.0
    progress = (step - warmup_steps) / (last - warmup_steps)
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))
