"""The built-in single-turn environments (docs/training.md), and the arithmetic rule the
built-in tool environments score with too.

- `arithmetic`: the prompt is `row["prompt"]`; reward 1.0 when the completion's first integer
  (optional leading whitespace, then `-?\\d+`) equals `int(row["answer"])`, else 0.0.
- `clock`: `arithmetic` with a wall-clock timestamp (`time.time_ns`) prefixed to the prompt — the
  model-visible nondeterminism that fixed seeds cannot remove and capture/replay can.

`observation_fault(prompt)` is the `--inject observation@STEP` hook: it prepends the same kind of
timestamp to any observation. This module does not import torch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from twinrun.core.errors import DataError
from twinrun.core.rng import Stream
from twinrun.rl.single_turn import OneTurnEnvironment

_LEADING_INT = re.compile(r"\s*(-?\d+)")


def wall_clock_stamp() -> str:
    """`[time 2026-11-30T09:12:33.123456] ` from `time.time_ns()` (UTC, microseconds)."""
    ns = time.time_ns()
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=rest // 1000)
    return f"[time {stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}] "


def observation_fault(prompt: str) -> str:
    """The `observation` fault: the observation with a wall-clock timestamp prepended."""
    return wall_clock_stamp() + prompt


def _field(row: Mapping[str, Any], key: str, env: str) -> Any:
    if key not in row:
        raise DataError(
            f"environment {env!r}: examples row has no {key!r} field (keys: {sorted(row)})",
            f"every row needs {key!r} for --env {env}",
        )
    return row[key]


def first_integer(completion: str) -> int | None:
    """The integer the completion starts with (after optional whitespace), or None."""
    match = _LEADING_INT.match(completion)
    return int(match.group(1)) if match else None


def arithmetic_reward(row: Mapping[str, Any], completion: str, env: str) -> float:
    """1.0 iff `completion` (a single-turn completion, a tool episode's final model turn) starts
    with int(row["answer"]), else 0.0; a DataError naming the environment when the row has no
    integer answer."""
    raw = _field(row, "answer", env)
    try:
        answer = int(str(raw).strip())
    except ValueError:
        raise DataError(f"environment {env!r}: 'answer' {raw!r} is not an integer") from None
    return 1.0 if first_integer(completion) == answer else 0.0


class ArithmeticEnvironment(OneTurnEnvironment):
    """Exact-integer-answer environment: reward 1.0 iff the completion starts with the answer."""

    name = "arithmetic"

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        prompt = _field(row, "prompt", self.name)
        if not isinstance(prompt, str):
            raise DataError(f"environment {self.name!r}: 'prompt' must be a string")
        return prompt

    def reward(self, row: dict[str, Any], completion: str) -> float:
        return arithmetic_reward(row, completion, self.name)


class ClockEnvironment(ArithmeticEnvironment):
    """`arithmetic` whose observation starts with the wall-clock time: never reproducible."""

    name = "clock"

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return wall_clock_stamp() + super().prompt(row, rng)


BUILTINS: dict[str, type[ArithmeticEnvironment]] = {
    "arithmetic": ArithmeticEnvironment,
    "clock": ClockEnvironment,
}

BUILTIN_ENVIRONMENTS = tuple(BUILTINS)
