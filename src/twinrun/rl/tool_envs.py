"""The built-in multi-turn GRPO environments with tools (docs/tool-environments.md): what the
rollout loop talks to, turn by turn.

`open_environment("calculator", max_turns=..., timeout_s=...)` (`environments.py`) gives one;
its `episode(row, rng)` is one rollout with a fresh instance of the environment: `start()` is the
first user message, `answer(text)` replies to each model turn with tool or user messages (and
says when the episode is done), `reward()` scores the episode, `close()` ends it. `tools` are
the JSON schemas offered to the model.

- `calculator`: the row's prompt and an instruction; the tool `calculate(expression)` evaluates
  + - * / // % ** and parentheses on numbers (parsed with `ast`: no names, no calls, at most
  MAX_EXPRESSION characters, exponents at most MAX_EXPONENT, integers at most 10**100). A turn
  with a tool call gets the tool messages; a turn that starts with an integer ends the
  episode; any other turn gets the user message NUDGE. Reward 1.0 iff the final turn's first
  integer is `int(row["answer"])`.
- `lookup`: the same with the tool `lookup(key)` over LOOKUP_TABLE (chemical elements to their
  atomic numbers); every reply (tool results and the nudge) starts with a wall-clock timestamp,
  the model-visible nondeterminism capture and replay exist for.

Every call into the environment's code runs under `--tool-timeout`. A plugin's tool environments
(TRL, OpenEnv or MCP shape) and an OpenEnv server at `http://127.0.0.1:PORT` are `tool_plugins`'.
This module does not import torch.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

from twinrun.core.errors import DataError
from twinrun.core.rng import Stream
from twinrun.rl.builtin_envs import arithmetic_reward, first_integer, wall_clock_stamp
from twinrun.rl.env_protocol import EnvReply, TurnPlan
from twinrun.rl.tool_base import Guard, Toolbox, row_prompt, tool_messages
from twinrun.rl.tool_calls import parse_tool_calls, tool_schema
from twinrun.rl.tool_settings import ToolLimits

MAX_EXPRESSION = 200
MAX_EXPONENT = 64
MAX_INTEGER = 10**100
NUDGE = "Reply with the answer as a number, or call {tool}."
INSTRUCTION = (
    "You can call the tool {tool} ({what}). When you know the answer, reply with it as a "
    "number at the start of your message."
)
LOOKUP_TABLE = {
    "hydrogen": "1", "helium": "2", "lithium": "3", "carbon": "6", "nitrogen": "7",
    "oxygen": "8", "neon": "10", "sodium": "11", "aluminium": "13", "silicon": "14",
    "iron": "26", "copper": "29", "silver": "47", "tin": "50", "gold": "79", "lead": "82",
}  # fmt: skip
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip


def _checked(value: Any) -> int | float:
    if isinstance(value, complex) or not isinstance(value, int | float):
        raise ValueError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not finite")
    if isinstance(value, int) and abs(value) > MAX_INTEGER:
        raise ValueError("the result is too large")
    return value


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _value(node.operand)
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponents above {MAX_EXPONENT} are refused")
        return _checked(_OPS[type(node.op)](left, right))
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression, or ValueError / ZeroDivisionError /
    OverflowError saying why not."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("the expression is not valid arithmetic") from None
    return _value(tree.body)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "(3 + 4) * 2".
    """
    return str(evaluate(expression))


def lookup(key: str) -> str:
    """Look up the atomic number of a chemical element.

    Args:
        key: The element's English name, e.g. "neon".
    """
    value = LOOKUP_TABLE.get(key.strip().lower())
    if value is None:
        raise ValueError(f"no entry for {key[:40]!r}; the keys are: {', '.join(LOOKUP_TABLE)}")
    return value


class ArithmeticToolEpisode:
    """A built-in episode: one tool, an integer answer, a nudge for turns with neither."""

    def __init__(self, name: str, fn: Callable[..., str], what: str, stamped: bool,
                 row: dict[str, Any], guard: Guard) -> None:  # fmt: skip
        self.name, self.row, self.stamped = name, row, stamped
        self.tool = fn.__name__
        self.what = what
        self.tools: tuple[dict[str, Any], ...] = (tool_schema(fn),)
        self.toolbox = Toolbox(guard, self.tools, lambda _, args: fn(**args),
                               {self.tool: inspect.signature(fn)})  # fmt: skip
        self.final = ""

    def _stamp(self, text: str) -> str:
        return wall_clock_stamp() + text if self.stamped else text

    def start(self) -> str:
        return f"{row_prompt(self.row, self.name)}\n" + INSTRUCTION.format(
            tool=self.tool, what=self.what
        )

    def answer(self, text: str) -> EnvReply:
        self.final = text
        calls = parse_tool_calls(text)
        if calls:
            records = [self.toolbox.run(c) for c in calls]
            records = [dataclasses.replace(r, result=self._stamp(r.result)) for r in records]
            return EnvReply(tool_messages(records), False, tuple(records))
        if first_integer(text) is not None:
            return EnvReply((), True)
        nudge = self._stamp(NUDGE.format(tool=self.tool))
        return EnvReply(({"role": "user", "content": nudge},), False)

    def reward(self) -> float:
        return arithmetic_reward(self.row, self.final, self.name)

    def close(self) -> None:
        pass


class BuiltinToolEnvironment:
    """`calculator` or `lookup`."""

    def __init__(self, name: str, limits: ToolLimits) -> None:
        self.name = name
        self.plan = TurnPlan(limits.max_turns, tool_turns=True)
        self.guard = Guard(name, limits.timeout_s)

    def episode(self, row: dict[str, Any], rng: Stream) -> ArithmeticToolEpisode:
        if self.name == "calculator":
            return ArithmeticToolEpisode(
                self.name, calculate, "it evaluates arithmetic", False, row, self.guard
            )
        return ArithmeticToolEpisode(
            self.name, lookup, "it gives a chemical element's atomic number", True, row, self.guard
        )

    def check_rows(self, rows: list[Any], seed: int) -> None:
        """Every row has its string prompt and integer answer; a DataError naming the first
        row that does not."""
        for i, row in enumerate(rows):
            data = dict(row.data)
            try:
                row_prompt(data, self.name)
                arithmetic_reward(data, "", self.name)
            except DataError as exc:
                where = getattr(row, "where", f"row {i}")
                raise type(exc)(f"{where}: {exc.message}", exc.hint) from None


TOOL_ENVIRONMENTS = ("calculator", "lookup")
