"""Click options generated from the run settings' declarations, and the click types for numbers.

Training numbers have no defaults at the click level: a missing one is reported (with every other
missing one) by config validation, in one error. Numbers are parsed as finite floats and plain
integers here; ranges are checked by the declarations, so a flag and its TOML key get the same
rule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import click

from twinrun.config.run import SETTINGS, RunConfig
from twinrun.config.setting import Setting, settings_of
from twinrun.config.values import parse_env_args, parse_lora_targets

F = Callable[..., Any]


class FiniteFloat(click.ParamType):
    """A float that is finite: `inf`, `nan` and `1e309` (which overflows to inf) are refused, and
    so is a value below `low` (or equal to it when `low_open`)."""

    name = "float"
    value_free_messages = True  # its messages never repeat the value (cli.usage shows them)

    def __init__(self, low: float | None = None, low_open: bool = False) -> None:
        self.low, self.low_open = low, low_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            self.fail("not a number", param, ctx)
        if not math.isfinite(number):
            self.fail("must be a finite number", param, ctx)
        if self.low is not None and (number <= self.low if self.low_open else number < self.low):
            self.fail(f"must be {'>' if self.low_open else '>='} {self.low:g}", param, ctx)
        return number


FINITE_FLOAT = FiniteFloat()
CLICK_TYPES: dict[str, Any] = {"int": click.INT, "float": FINITE_FLOAT, "str": click.STRING}


def option(name: str, s: Setting, mark: str = "") -> F:
    """The click option for one declared setting; its parameter is the field name. `mark`
    ("[required]") starts its help."""
    kwargs: dict[str, Any] = {"help": f"{mark} {s.help}".strip()}
    if s.kind == "bool":
        if "/" not in s.flag:
            kwargs["is_flag"] = True
        kwargs["default"] = bool(s.default)
        kwargs["show_default"] = "/" in s.flag
    elif s.multiple:
        kwargs["multiple"] = True
    else:
        kwargs["type"] = CLICK_TYPES.get(s.kind, click.STRING)
        if s.default is not None:
            kwargs["default"] = s.default
            kwargs["show_default"] = True
    if s.metavar:
        kwargs["metavar"] = s.metavar
    return click.option(s.flag, name, **kwargs)


def _stack(decorators: list[F]) -> F:
    def apply(fn: F) -> F:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return apply


def run_options(objective: str) -> F:
    """Every declared flag that applies to `objective`, in declaration order; `--help` marks
    the ones a run must be given."""
    return _stack(
        [
            option(n, s, required_mark(n, s, objective))
            for n, s in SETTINGS.items()
            if s.flag and objective in s.objectives
        ]
    )


def required_mark(name: str, s: Setting, objective: str) -> str:
    """What `--help` says before a flag's help: "[required]" for a run number, "[required with
    --cpu-kernels native]" for the thread count (it shapes a native CPU run's bytes), else
    nothing."""
    if name == "threads":
        return "[required with --cpu-kernels native]"
    return "[required]" if s.required and objective in s.objectives else ""


def shared_options(*names: str, **changes: dict[str, Any]) -> F:
    """The run settings a non-training command shares (model, seed, ...), declared once;
    `changes` adjusts one for the command, e.g. `seed={"help": "Seed of the LoRA init."}`."""
    return _stack(
        [option(n, dataclasses.replace(SETTINGS[n], **changes.get(n, {}))) for n in names]
    )


def settings_options(cls: type) -> F:
    """The options of a settings dataclass whose fields carry their `Setting` (the inference
    commands', config/inference.py): one per field with a flag, in declaration order."""
    return _stack([option(n, s) for n, s in settings_of(cls).items() if s.flag])


def config_from_options(objective: str, opts: dict[str, Any]) -> RunConfig:
    """Click's values -> RunConfig: repeatable flags become lists, structured values parsed."""
    values = dict(opts)
    values["inject"] = list(values.get("inject") or [])
    if "corpus" in values:  # a repeatable flag given no time is "not given"
        values["corpus"] = list(values["corpus"] or []) or None
    if "env_args" in values:
        values["env_args"] = parse_env_args(values["env_args"])
    if values.get("lora_targets") is not None:
        values["lora_targets"] = parse_lora_targets(values["lora_targets"])
    return RunConfig(objective=objective, **values)
