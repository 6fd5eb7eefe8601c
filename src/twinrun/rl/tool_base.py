"""What every multi-turn tool environment shares (docs/tool-environments.md): the one error,
calls into user code under a time limit, and running the model's tool calls. The protocol
(`Environment`, `Episode`, its `TurnPlan`) and the episode records (`EnvReply`, `CallRecord`)
are `env_protocol.py`'s; a tool environment's plan takes tool turns, up to `--max-turns`.

`Guard` runs every call into an environment's code in a daemon worker thread and waits at most
`timeout_s`: past it, a ToolEnvironmentError says what did not return, and the thread is left to
finish (or not) on its own. Every failure of the environment's code is one line naming the
environment, with the texts of its argument values hidden. A failure of the model (a malformed
call, an unknown tool, wrong arguments) is never an error: it is a failed `CallRecord` and a
tool message that says so. This module does not import torch.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from twinrun.core import interrupts
from twinrun.core.errors import DataError
from twinrun.core.rng import Stream
from twinrun.rl.builtin_envs import arithmetic_reward
from twinrun.rl.env_checks import finite_reward, one_line
from twinrun.rl.env_protocol import CallRecord, EnvironmentPluginError
from twinrun.rl.tool_calls import ToolCall, canonical_json


class ToolEnvironmentError(EnvironmentPluginError):
    """A tool environment failed, returned something unusable or did not return in time."""


MAX_REPLY_CHARS = 1 << 20  # one tool reply or observation: many context windows of text
MAX_NESTING = 100  # levels of dicts/lists in a reply or a tool schema (JSON Schema needs < 10)
MAX_NODES = 1 << 20  # values in one reply or schema, counted as they are walked


def nesting_problem(value: Any) -> str | None:
    """Why `value` cannot be walked safely (nested deeper than MAX_NESTING, circular, more
    than MAX_NODES values), or None. Iterative: no recursion however deep the value."""
    stack, nodes = [(value, 0)], 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth >= MAX_NESTING:
            return f"is nested deeper than {MAX_NESTING} levels (or is circular)"
        nodes += len(children)
        if nodes > MAX_NODES:
            return f"holds more than {MAX_NODES} values (or is circular)"
        stack.extend((child, depth + 1) for child in children)
    return None


class _TimedOut(Exception):
    pass


class ToolFailed(Exception):
    """Raised by a tool's invocation to fail the call with this text shown verbatim."""


def bounded(timeout_s: float, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a daemon thread: its value, or its exception raised here;
    _TimedOut when it has not returned after `timeout_s` (the thread is abandoned), and
    interrupts.StopNow at once when the run is asked to stop before or while it waits."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except SystemExit as exc:  # a plugin's sys.exit() must not end the trainer
            box["error"] = RuntimeError(f"SystemExit({exc.code!r})")
        except KeyboardInterrupt:  # raised by the plugin itself: Python delivers a real
            # Ctrl-C to the main thread only, so here it is the environment's failure
            box["error"] = RuntimeError("KeyboardInterrupt raised by the environment's code")
        except BaseException as exc:  # carried to the caller's thread, raised there
            box["error"] = exc

    with interrupts.abandonable():  # a stop asked meanwhile ends the wait (the thread is left)
        worker = threading.Thread(target=work, name="twinrun-environment-call", daemon=True)
        worker.start()
        interrupts.join(worker, timeout_s)
    if worker.is_alive():
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class Guard:
    """Calls into one environment's code: its name, the time limit, the texts to hide."""

    env: str
    timeout_s: float
    hide: tuple[str, ...] = ()

    def line(self, text: object) -> str:
        return one_line(text, self.hide)[:300]

    def late(self, what: str) -> ToolEnvironmentError:
        return ToolEnvironmentError(
            f"environment {self.env!r}: {what} did not return within {self.timeout_s:g} s",
            "make the environment answer faster, or raise the environment's timeout",
        )

    def call(self, what: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The environment's own code: every failure is a ToolEnvironmentError."""
        try:
            return bounded(self.timeout_s, fn, *args, **kwargs)
        except _TimedOut:
            raise self.late(what) from None
        except ToolEnvironmentError:
            raise
        except Exception as exc:
            raise ToolEnvironmentError(
                f"environment {self.env!r}: {what} raised {type(exc).__name__}: {self.line(exc)}"
            ) from exc

    def text(self, what: str, value: Any) -> str:
        """A return value as model-visible text: str as is; int/float/bool str(); dict/list
        canonical JSON; None ""; any other type a ToolEnvironmentError. The text must be
        valid Unicode (no lone surrogates) and at most MAX_REPLY_CHARS characters; a dict/list
        at most MAX_NESTING levels deep (checked without recursion: a circular one is refused)."""
        if isinstance(value, str):
            return self.checked_text(what, value)
        if value is None:
            return ""
        if isinstance(value, bool | int | float):
            try:
                return self.checked_text(what, str(value))
            except ValueError:  # an int of more digits than Python converts (sys.int_info)
                raise ToolEnvironmentError(
                    f"environment {self.env!r}: {what} returned an int too large to show"
                ) from None
        if isinstance(value, dict | list):
            self.shallow(what, value)
            try:
                text = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise ToolEnvironmentError(
                    f"environment {self.env!r}: {what} returned a {type(value).__name__} that is "
                    f"not JSON ({type(exc).__name__})"
                ) from None
            return self.checked_text(what, text)
        raise ToolEnvironmentError(
            f"environment {self.env!r}: {what} returned {type(value).__name__}, not text",
            "return a str (or a number, dict, list or None)",
        )

    def checked_text(self, what: str, text: str) -> str:
        """`text` when the model can be shown it: at most MAX_REPLY_CHARS, valid Unicode."""
        if len(text) > MAX_REPLY_CHARS:
            raise ToolEnvironmentError(
                f"environment {self.env!r}: {what} returned {len(text)} characters, more than "
                f"the {MAX_REPLY_CHARS} one reply may hold",
                "make the environment answer shorter texts",
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolEnvironmentError(
                f"environment {self.env!r}: {what} returned text that is not valid Unicode "
                f"(a lone surrogate {text[exc.start]!a} at character {exc.start})",
                "return well-formed text (decode bytes with errors='replace')",
            ) from None
        return text

    def shallow(self, what: str, value: Any) -> None:
        """A ToolEnvironmentError when `value` (dicts, lists, tuples) nests deeper than
        MAX_NESTING levels or holds more than MAX_NODES values; a circular value is both."""
        if nesting_problem(value) is not None:
            raise ToolEnvironmentError(
                f"environment {self.env!r}: {what} {nesting_problem(value)}",
                "return plain JSON values, nested a few levels",
            )

    def reward(self, value: Any, what: str = "reward") -> float:
        return finite_reward(
            value, f"environment {self.env!r}: {what} is", ToolEnvironmentError,
            "the episode's reward must be a finite float",
        )  # fmt: skip


def row_prompt(row: Mapping[str, Any], env: str) -> str:
    """The row's "prompt" string (DataError naming the environment otherwise)."""
    prompt = row.get("prompt")
    if not isinstance(prompt, str):
        raise DataError(
            f"environment {env!r}: examples row has no string 'prompt' field (keys: {sorted(row)})",
            f"every row needs 'prompt' for --env {env} (or a reset that returns text)",
        )
    return prompt


def row_kwargs(fn: Callable[..., Any], row: Mapping[str, Any], rng: Stream) -> dict[str, Any]:
    """What `reset` receives: every row field when it takes **kwargs, else the fields its
    parameters name; `rng` (the rollout's twinrun stream) when it has a parameter of that name."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return {}
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    fields = {k: v for k, v in row.items() if isinstance(k, str) and k.isidentifier()}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        chosen = fields
    else:
        chosen = {k: v for k, v in fields.items() if k in named}
    if "rng" in named:
        chosen["rng"] = rng
    return chosen


def reward_of(guard: Guard, obj: Any, row: Mapping[str, Any], final: str) -> float:
    """An environment object's score: its `reward()` method — with no required arguments, or
    with one named `completion`, given the final model turn's text — else a numeric `reward`
    attribute, else the arithmetic rule on the final model turn."""
    attr = inspect.getattr_static(obj, "reward", None)
    if attr is None:
        return arithmetic_reward(row, final, guard.env)
    value = guard.call("reward", lambda: obj.reward)  # a property is code too
    if callable(value):
        try:
            required = [
                p.name
                for p in inspect.signature(value).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            required = []
        given = {"completion": final} if _takes(value, "completion") else {}
        if [name for name in required if name not in given]:
            raise ToolEnvironmentError(
                f"environment {guard.env!r}: reward() requires arguments {required}",
                "define reward(self) or reward(self, completion) (the final model turn's "
                "text), or a numeric reward attribute",
            )
        value = guard.call("reward", value, **given)
    return guard.reward(value)


def _takes(fn: Any, name: str) -> bool:
    """Whether `fn` has a parameter `name` that can be passed by keyword."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


_JSON_CHECK: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,),
    "array": (list,), "object": (dict,),
}  # fmt: skip


def argument_problem(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why `arguments` do not fit a JSON-schema `parameters` object (required names, the basic
    types, unknown names when additionalProperties is false), or None."""
    props = parameters.get("properties") or {}
    missing = [r for r in parameters.get("required") or [] if r not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))}"
    if parameters.get("additionalProperties") is False:
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return f"unexpected argument(s) {', '.join(repr(k[:40]) for k in unknown[:8])}"
    for key, value in arguments.items():
        kind = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else None
        allowed = _JSON_CHECK.get(kind) if isinstance(kind, str) else None
        if allowed is None:
            continue
        if (isinstance(value, bool) and kind != "boolean") or not isinstance(value, allowed):
            return f"argument {key!r} must be a JSON {kind}, got {type(value).__name__}"
    return None


@dataclass
class Toolbox:
    """The tools of one episode: their schemas, and how to invoke one by name. `invoke(name,
    arguments)` is the environment's code; `signatures` (optional) checks the names bound."""

    guard: Guard
    schemas: tuple[dict[str, Any], ...]
    invoke: Callable[[str, dict[str, Any]], Any]
    signatures: dict[str, inspect.Signature] = dataclasses.field(default_factory=dict)

    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    def run(self, call: ToolCall) -> CallRecord:
        def failed(why: str) -> CallRecord:
            return CallRecord(call.name, call.raw if call.arguments is None else call.arguments,
                              False, f"error: {why}")  # fmt: skip

        if call.error is not None or call.arguments is None:
            return failed(call.error or "malformed tool call")
        by_name = {s["function"]["name"]: s["function"] for s in self.schemas}
        if call.name not in by_name:
            tools = ", ".join(self.names()) or "none"
            return failed(f"unknown tool {call.name[:60]!r}; the tools are: {tools}")
        problem = argument_problem(by_name[call.name].get("parameters") or {}, call.arguments)
        if problem is None and call.name in self.signatures:
            try:
                self.signatures[call.name].bind(**call.arguments)
            except TypeError as exc:
                problem = " ".join(str(exc).split())[:200]
        if problem is not None:
            return failed(f"tool {call.name!r}: {problem}")
        try:
            value = bounded(self.guard.timeout_s, self.invoke, call.name, call.arguments)
        except _TimedOut:
            raise self.guard.late(f"tool {call.name!r}") from None
        except ToolEnvironmentError:
            raise
        except ToolFailed as exc:
            return failed(self.guard.line(exc))
        except Exception as exc:  # the tool's failure is shown to the model; the episode goes on
            return failed(f"{type(exc).__name__}: {self.guard.line(exc)}")
        text = self.guard.text(f"tool {call.name!r}", value)
        return CallRecord(call.name, call.arguments, True, text)


def tool_messages(records: list[CallRecord]) -> tuple[dict[str, str], ...]:
    return tuple({"role": "tool", "content": r.result} for r in records)
