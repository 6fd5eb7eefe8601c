"""`twinrun check --quick`: a fixed small budget for a fast answer.

The training command is run for its first `QUICK_STEPS` optimizer steps only (`--stop-after`:
the schedule, the data order and every step's bytes are the full run's, so a quick answer is a
true answer about those steps), and an in-training evaluation (`--eval-examples`) scores its
first `QUICK_EVAL_EXAMPLES` examples (`--eval-limit`). Three steps are the fewest that show a
step-0 mismatch, drift after an update, and a seed that changes the loss.
"""

from __future__ import annotations

from collections.abc import Sequence

from twinrun.core.errors import ConfigError
from twinrun.objectives.registry import NAMES

QUICK_STEPS = 3
QUICK_EVAL_EXAMPLES = 8
BUDGET_FLAGS = ("--stop-after", "--eval-limit")


def quick_command(cmd: Sequence[str]) -> tuple[str, ...]:
    """`cmd` (a `twinrun tune ...` training command) with the quick budget appended."""
    at = [i for i, a in enumerate(cmd[:-1]) if a == "tune" and cmd[i + 1] in NAMES]
    if not at:
        raise ConfigError(
            f"--quick needs a twinrun training command (twinrun tune {'|'.join(NAMES)} ...)",
            "run the command without --quick",
        )
    given = [f for f in BUDGET_FLAGS if any(a == f or a.startswith(f + "=") for a in cmd)]
    if given:
        raise ConfigError(
            f"--quick sets {given[0]} itself", f"drop {given[0]} from the command, or --quick"
        )
    out = [*cmd, "--stop-after", str(QUICK_STEPS)]
    if any(a == "--eval-examples" or a.startswith("--eval-examples=") for a in cmd):
        out += ["--eval-limit", str(QUICK_EVAL_EXAMPLES)]
    return tuple(out)
