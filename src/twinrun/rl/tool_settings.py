"""The settings a GRPO run's environment kind asks for (torch-free: `twinrun explain` checks them
without building a model). A tool environment needs `--max-turns` and `--tool-timeout`
(`tool_limits`, the one check that requires them, run by `open_environment` once the kind is
known: the code after it reads `ToolLimits`), `--chat-template on`, and is not given the
single-turn observation fault (`check_tool_run`); a single-turn one takes neither limit."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from twinrun.core.errors import ConfigError

MAX_TIMEOUT_S = 86400  # one day: a longer limit is no limit (and overflows a thread's wait)


@dataclass(frozen=True)
class ToolLimits:
    """A tool environment's limits, given and in range: the model turns an episode takes at
    most, and the seconds any one call into the environment's code may take."""

    max_turns: int
    timeout_s: float


def check_limit_values(env: str, max_turns: int | None, timeout_s: float | None) -> None:
    """ConfigError when a limit that is given is out of range (checked before any of the
    environment's code runs: a plugin's factory is probed under the timeout)."""
    if timeout_s is not None and (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, int | float)
        or not (math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S)
    ):
        raise ConfigError(
            f"environment {env!r}: --tool-timeout must be a number of seconds in "
            f"(0, {MAX_TIMEOUT_S}]"
        )
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ConfigError(f"environment {env!r}: --max-turns must be an integer >= 1")


def tool_limits(
    env: str, tool: bool, max_turns: int | None, timeout_s: float | None
) -> ToolLimits | None:
    """The limits of environment `env` (`tool`: whether it is a tool environment): a tool
    environment's `ToolLimits`, None for a single-turn one. ConfigError (one line, every missing
    flag named) when a tool environment lacks one, or a single-turn one is given one (their
    values are `check_limit_values`')."""
    limits = (("--max-turns", max_turns), ("--tool-timeout", timeout_s))
    if not tool:
        given = [flag for flag, value in limits if value is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} apply to tool environments only; {env!r} is single-turn",
                "remove them, or use a tool environment (e.g. --env calculator)",
            )
        return None
    if max_turns is None or timeout_s is None:
        missing = [flag for flag, value in limits if value is None]
        raise ConfigError(
            f"tool environment {env!r} needs {' and '.join(missing)}",
            "give the turn limit of an episode and the seconds one environment call may take",
        )
    return ToolLimits(max_turns, float(timeout_s))


def check_tool_run(*, env: str, chat_template: str | None, inject: Iterable[str]) -> None:
    """ConfigError (one line) when the rest of a tool environment's run does not fit it: tool
    messages are rendered by the chat template, and its observations are its own."""
    if chat_template != "on":
        raise ConfigError(
            f"tool environment {env!r} needs --chat-template on (tool messages are rendered by "
            "the chat template)"
        )
    if any(spec.startswith("observation@") for spec in inject):
        raise ConfigError(
            "--inject observation@STEP applies to single-turn environments; a tool "
            "environment's observations are its own (the lookup environment's carry the clock)"
        )
