"""One declaration per run setting: its flag, TOML key, kind, range or choices, help, whether it is
required, whether it is recorded in the sidecar, and which objectives it applies to.

A `Setting` sits in the metadata of a config dataclass field (see `declare`). The click options,
the TOML schema, the value checks and the sidecar's `train` keys are all generated from it, so a
setting cannot say one thing on the command line and another in a TOML file. A check names the
setting the way the user gave it: `--learning-rate` for a flag, `training.learning_rate` for TOML.

Value checks never echo a value that could hold a secret: numbers are shown, a string only when
it is a short plain word (a mistyped choice such as `fp16`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from twinrun.objectives.registry import NAMES as OBJECTIVES

INT_LIMIT = 2**63  # every integer setting is below it (a torch/numpy int64 must hold it)

Kind = Literal["int", "float", "str", "bool", "list[str]", "list[int]", "table", "pair", "targets"]
Source = Literal["flag", "toml"]

KIND_WORDS: dict[str, str] = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true/false",
    "list[str]": "a list of strings",
    "list[int]": "a list of integers",
    "table": "a table",
    "pair": "a list of two numbers",
    "targets": "a list of module names or the string all-linear",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """What a setting is, once. Ranges apply to numbers: `low`/`high` bound the value, `*_open`
    makes a bound strict. Integers are always below 2**63 as well."""

    kind: Kind
    flag: str = ""
    """The command-line flag (`--seed`, or `--strict/--no-strict` for a switch pair); "" when the
    setting has no flag (TOML only)."""
    toml: str = ""
    """The dotted TOML key (`training.seed`); "" when the setting has none (command line only)."""
    help: str = ""
    required: bool = False
    """Must be given for every objective it applies to (no silent default)."""
    shapes: bool = True
    """Recorded in the sidecar's `train` section and compared on resume."""
    contract: bool = False
    """Decides what one optimizer update does to the adapter, given the step's batch: a key of
    the optimizer contract (config/contract.py), which a replay's must equal its source's, for
    every objective the setting applies to."""
    objectives: tuple[str, ...] = OBJECTIVES
    """The training commands that offer it; elsewhere a given value is refused."""
    record_for_all: bool = False
    """Recorded for every objective, not only those it applies to (older sidecars did)."""
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    choices: tuple[str, ...] = ()
    default: Any = None
    multiple: bool = False
    """A repeatable flag (`--inject A --inject B`)."""
    metavar: str = ""
    reason: str = ""
    """Said after a range error: why the bound is what it is."""

    @property
    def option(self) -> str:
        """The flag's main spelling (`--strict` for `--strict/--no-strict`)."""
        return self.flag.split("/")[0]

    def name(self, source: Source) -> str:
        """How the user named it: the TOML key for a TOML run (when there is one), else the flag."""
        if source == "toml" and self.toml:
            return self.toml
        return self.option or self.toml

    def problem(self, value: Any, source: Source) -> str | None:
        """What is wrong with a given (non-None) value, as one clause; None when it is fine."""
        name = self.name(source)
        if self.kind in ("int", "float"):
            return number_problem(name, value, self)
        if self.kind in ("pair", "list[int]"):
            return self._numbers_problem(name, value)
        if self.choices and value not in self.choices:
            return f"{name} must be {_either(self.choices)}"  # the value is not shown: a secret?
        return None

    def _numbers_problem(self, name: str, value: Any) -> str | None:
        """A pair (two numbers) or a list of integers, each number in the setting's range."""
        if self.kind == "pair" and (not isinstance(value, list | tuple) or len(value) != 2):
            return f"{name} must be two numbers"
        if not isinstance(value, list | tuple):
            return f"{name} must be a list of integers"
        return next((p for item in value if (p := number_problem(name, item, self))), None)

    def range_words(self) -> str:
        lo, hi = self.low, self.high
        if self.kind == "int" and (hi is None or hi >= INT_LIMIT):
            hi, hi_open = INT_LIMIT, True
        else:
            hi_open = self.high_open
        if lo is not None and hi is not None:
            left = "(" if self.low_open else "["
            right = ")" if hi_open else "]"
            return f"in {left}{_num(lo)}, {_num(hi)}{right}"
        if lo is not None:
            return f"{'>' if self.low_open else '>='} {_num(lo)}"
        if hi is not None:
            return f"{'<' if hi_open else '<='} {_num(hi)}"
        return "finite"


def number_problem(name: str, value: Any, s: Setting) -> str | None:
    """A number's problem: wrong type, not finite, or out of the declared range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} must be {KIND_WORDS[s.kind if s.kind != 'pair' else 'float']}"
    if s.kind in ("int", "list[int]") and not isinstance(value, int):
        return f"{name} must be an integer"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} must be a finite number, got {value}"
    lo_ok = s.low is None or (value > s.low if s.low_open else value >= s.low)
    if s.kind in ("int", "list[int]") and (s.high is None or s.high >= INT_LIMIT):
        hi_ok = -INT_LIMIT <= value < INT_LIMIT
        if s.high is not None and s.high < INT_LIMIT:
            hi_ok = hi_ok and value <= s.high
    else:
        hi_ok = s.high is None or (value < s.high if s.high_open else value <= s.high)
    if lo_ok and hi_ok:
        return None
    if s.low is not None and s.high is None and s.kind == "int" and not lo_ok:
        words = f"{'>' if s.low_open else '>='} {_num(s.low)}"  # the bound the value missed
    elif s.low is not None and s.high is None and s.kind == "int":
        words = f"< {_num(INT_LIMIT)}"
    else:
        words = s.range_words()
    reason = f" ({s.reason})" if s.reason else ""
    return f"{name} must be {words}{reason}, got {show_number(value)}"


def show_number(value: int | float) -> str:
    """A number as a message shows it; a huge integer only by its size (str() refuses some)."""
    if isinstance(value, int) and value.bit_length() > 80:
        return "an integer too large to show"
    return str(value)


def _num(x: float) -> str:
    if x == INT_LIMIT:
        return "2**63"
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _either(choices: tuple[str, ...]) -> str:
    if len(choices) == 1:
        return choices[0]
    if len(choices) == 2:
        return f"{choices[0]} or {choices[1]}"
    return "one of " + ", ".join(choices)


def declare(setting: Setting) -> Any:
    """A dataclass field carrying its `Setting` (its default is the setting's)."""
    if isinstance(setting.default, list):
        default = list(setting.default)
        return field(default_factory=lambda: list(default), metadata={"setting": setting})
    return field(default=setting.default, metadata={"setting": setting})


def settings_of(cls: type) -> dict[str, Setting]:
    """Field name -> Setting, in declaration order, for a dataclass whose fields use `declare`."""
    return {
        f.name: f.metadata["setting"] for f in dataclasses.fields(cls) if "setting" in f.metadata
    }


def type_ok(kind: str, value: Any) -> bool:
    """Whether a parsed (TOML) value has the setting's kind; ranges are checked afterwards."""

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    def integer(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def strings(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)

    return {
        "str": lambda v: isinstance(v, str),
        "int": integer,
        "float": number,
        "bool": lambda v: isinstance(v, bool),
        "list[str]": strings,
        "list[int]": lambda v: isinstance(v, list) and all(integer(x) for x in v),
        "table": lambda v: isinstance(v, dict),
        "pair": lambda v: isinstance(v, list) and len(v) == 2 and all(number(x) for x in v),
        "targets": lambda v: isinstance(v, str) or strings(v),
    }[kind](value)


def type_name(value: Any) -> str:
    """What a value is, in words, without showing it."""
    words = {bool: "true/false", int: "an integer", float: "a number", str: "a string"}
    words |= {list: "a list", dict: "a table"}
    return words.get(type(value), type(value).__name__)
