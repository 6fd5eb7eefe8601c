"""A complete TOML config for one objective, written by `twinrun init OBJECTIVE`: every setting
that applies to it, under its TOML key, with its help as a comment.

With `defaults="trl"` every number TRL 1.16 (and PEFT's `LoraConfig`) has a default for is
written out with where it came from, and `training.defaults = "trl"` stays in the file, so a
number still left out when it runs (PEFT's LoRA targets, known once the model is) is taken and
recorded then. Without it the numbers a run must be given are written commented out, marked
required: twinrun has no silent defaults, and `twinrun run` names each one still missing. The
settings with a stated default are written commented out at that default.
"""

from __future__ import annotations

import json
import math
from typing import Any

from twinrun.config.run import SETTINGS, RunConfig
from twinrun.config.setting import Setting
from twinrun.config.trl_defaults import TRL_VERSION, trl_defaults
from twinrun.objectives.registry import BY_NAME

# given paths (the command's flags) -> the settings they fill
PATHS = ("model", "examples", "output")


def starter_toml(objective: str, defaults: str | None = None, **given: Any) -> str:
    """The TOML text of a config for `objective`; `given` fills settings by field name (the
    model, the examples file and the run directory)."""
    cfg = RunConfig(objective=objective, defaults=defaults, **given)
    trl_config = BY_NAME[objective].trl_config
    taken = trl_defaults(cfg) if defaults is not None and trl_config else {}
    values = {n: v.value for n, v in taken.items()} | {
        n: v for n, v in given.items() if v is not None
    }
    tables: dict[str, list[str]] = {"training": [f'trainer = "{objective}"']}
    if defaults is not None:
        tables["training"].append(
            f'defaults = "{defaults}"  # numbers left out are TRL {TRL_VERSION}\'s '
            f"{trl_config} defaults"
        )
    for name, s in SETTINGS.items():
        if not s.toml or name in ("objective", "defaults") or objective not in s.objectives:
            continue
        table, key = s.toml.rsplit(".", 1)
        tables.setdefault(table, []).append(_line(key, s, values, taken, name))
    out = [
        f"# twinrun {objective} run. Edit it, then: twinrun run THIS_FILE.toml",
        "# Every key: the table 'Every setting' in docs/training.md.",
    ]
    for table, lines in tables.items():
        out += ["", f"[{table}]", *lines]
    return "\n".join(out) + "\n"


def _line(key: str, s: Setting, values: dict[str, Any], taken: dict[str, Any], name: str) -> str:
    """One setting's line: its value (given or taken), else commented out at its default or
    marked required."""
    help_words = " ".join(s.help.split())
    if name in values:
        if values[name] is None:  # a default that leaves the setting off
            return f"# {key} =  # off: {taken[name].source}"
        source = f"  # {taken[name].source}" if name in taken and name not in PATHS else ""
        return f"{key} = {toml_value(values[name])}{source}"
    if s.required:
        return f"# {key} =  # required: {help_words}"
    shown = "" if s.default is None or s.default == [] else f" {toml_value(s.default)}"
    return f"# {key} ={shown}  # {help_words}"


def toml_value(value: Any) -> str:
    """A value as TOML writes it (strings as JSON-escaped basic strings, which TOML reads)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"a TOML config holds finite numbers, got {value}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")
