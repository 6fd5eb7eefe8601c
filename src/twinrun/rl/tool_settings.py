"""The settings a GRPO run's environment kind asks for (torch-free: `twinrun explain` checks them
without building a model): a tool environment needs `--max-turns`, `--tool-timeout` and
`--chat-template on`, and is not given the single-turn observation fault; a single-turn one
takes neither limit. The built-in tool environments' rows are checked before anything is
written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twinrun.core.errors import ConfigError, DataError


def check_tool_settings(
    *,
    env: str,
    max_turns: int | None,
    tool_timeout: float | None,
    chat_template: str | None,
    inject: Iterable[str],
    tool: bool,
) -> None:
    """ConfigError (one line) when the run's settings do not fit its environment's kind (`env`,
    `tool`: whether it is a tool environment)."""
    name = env
    limits = (("--max-turns", max_turns), ("--tool-timeout", tool_timeout))
    if not tool:
        given = [flag for flag, value in limits if value is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} apply to tool environments only; {name!r} is single-turn",
                "remove them, or use a tool environment (e.g. --env calculator)",
            )
        return
    missing = [flag for flag, value in limits if value is None]
    if missing:
        raise ConfigError(
            f"tool environment {name!r} needs {' and '.join(missing)}",
            "give the turn limit of an episode and the seconds one environment call may take",
        )
    if chat_template != "on":
        raise ConfigError(
            f"tool environment {name!r} needs --chat-template on (tool messages are rendered by "
            "the chat template)"
        )
    if any(spec.startswith("observation@") for spec in inject):
        raise ConfigError(
            "--inject observation@STEP applies to single-turn environments; a tool "
            "environment's observations are its own (the lookup environment's carry the clock)"
        )


def check_tool_rows(name: str, rows: list[Any]) -> None:
    """Every examples row of a built-in tool environment (`calculator`, `lookup`) has its string
    prompt and integer answer; a DataError naming the first row that does not."""
    from twinrun.rl.environments import arithmetic_reward, environment_kind
    from twinrun.rl.tool_base import row_prompt

    if environment_kind(name) != "tool":
        return  # plugins and URLs read their rows their own way
    for i, row in enumerate(rows):
        data = dict(row.data)
        try:
            row_prompt(data, name)
            arithmetic_reward(data, "", name)
        except DataError as exc:
            where = getattr(row, "where", f"row {i}")
            raise type(exc)(f"{where}: {exc.message}", exc.hint) from None
