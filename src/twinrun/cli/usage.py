"""Command-line usage errors as one line that never repeats what was typed.

click's own messages echo the value ("Invalid value for '--seed': 'sk-live-…' is not a valid
integer.", "Got unexpected extra argument (…)", "No such command '…'."), and a value on a command
line may be a secret. Here each usage error is rebuilt from what click knows about it: the flag
or argument it concerns and the kind of value that one needs. An unknown flag is named (click
splits `--name=value` before it looks the name up, so the value is never part of it) with the
closest real flag; an unknown command is not named, only the closest real command.
"""

from __future__ import annotations

import difflib
from typing import Any

import click

from twinrun.cli.trl_names import other_objectives_flag, twinrun_name

SHOWN_NAME = 40  # an unknown flag longer than this is not shown: it is not a mistyped flag


def describe(kind: click.ParamType) -> str:
    """What a value of `kind` is, in words (never a value itself)."""
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(str(c) for c in kind.choices)
    if isinstance(kind, click.IntRange | click.FloatRange):
        number = "an integer" if isinstance(kind, click.IntRange) else "a number"
        bounds = [f">= {kind.min}" if kind.min is not None else "",
                  f"<= {kind.max}" if kind.max is not None else ""]  # fmt: skip
        return " ".join([number, *(b for b in bounds if b)])
    if isinstance(kind, click.Path):
        what = {
            (True, False): "a file path, not a directory",
            (False, True): "a directory path, not a file",
        }.get(  # fmt: skip
            (kind.file_okay, kind.dir_okay), "a path"
        )
        return what + (" that exists" if kind.exists else "")
    if isinstance(kind, click.Tuple):
        return f"{len(kind.types)} values: " + ", then ".join(describe(t) for t in kind.types)
    words: dict[Any, str] = {click.INT: "an integer", click.FLOAT: "a number",
                             click.BOOL: "true or false", click.UUID: "a UUID"}  # fmt: skip
    return words.get(kind, f"a valid {kind.name}")


def _closest(name: str, names: list[str]) -> str:
    near = difflib.get_close_matches(name[:SHOWN_NAME], names, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _bad_value_line(exc: click.BadParameter) -> str:
    """A bad value's line: the flag or argument it was for, and the kind of value that needs."""
    hint = exc.param_hint
    if hint is None and exc.param is not None:
        hint = exc.param.get_error_hint(exc.ctx)
    if isinstance(hint, list | tuple):
        hint = " / ".join(repr(h) for h in hint)
    where = f" for {hint}" if hint else ""
    if exc.param is None:
        return f"Invalid value{where}"
    if getattr(exc.param.type, "value_free_messages", False):  # its messages name no value
        return f"Invalid value{where}: {exc.message}"
    return f"Invalid value{where}: needs {describe(exc.param.type)}"


def _no_such_command_line(exc: click.UsageError, command_name: str | None) -> str:
    """An unknown command's line: never its name, only the closest real command."""
    ctx, names = exc.ctx, []
    if ctx is not None and isinstance(ctx.command, click.Group):
        names = ctx.command.list_commands(ctx)
    return "no such command" + _closest(str(command_name or ""), names)


def _tune_objective(ctx: click.Context | None) -> str | None:
    """The objective of a `twinrun tune OBJECTIVE` context (None for any other command)."""
    if ctx is None or ctx.parent is None or ctx.parent.info_name != "tune":
        return None
    return ctx.info_name


def usage_line(exc: click.UsageError) -> str:
    """The one line for `exc`: which flag or argument, and what it needs — without the value."""
    if isinstance(exc, click.MissingParameter):  # "Missing option '--output'.": no value in it
        return exc.format_message()
    if isinstance(exc, click.BadParameter):
        return _bad_value_line(exc)
    if isinstance(exc, click.NoSuchOption):
        name = exc.option_name
        if len(name) > SHOWN_NAME:
            return f"no such option (an unknown flag of {len(name)} characters)"
        objective = _tune_objective(exc.ctx)
        theirs = twinrun_name(name, objective)  # TRL's spelling: twinrun's name, not the nearest
        if theirs is None:
            return f"No such option '{name}' (TRL's; twinrun has no such setting)."
        if theirs:
            return f"No such option '{name}'. twinrun's name for TRL's {name}: {theirs}."
        other = other_objectives_flag(name, objective) if objective else ""
        if other:
            return f"No such option '{name}': {other}."
        return exc.format_message()  # the name and the closest real flags
    command_name = getattr(exc, "command_name", None)
    if command_name is not None or exc.message.startswith("No such command"):
        return _no_such_command_line(exc, command_name)
    if exc.message.startswith("Got unexpected extra argument"):
        return (
            "got an unexpected extra argument (a value without its flag, or one the command "
            "does not take)"
        )
    return exc.format_message()  # click's others name flags only ("requires an argument")
