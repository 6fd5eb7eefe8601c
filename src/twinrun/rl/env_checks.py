"""The checks every call into a single-turn environment's code passes (docs/training.md): its
prompt must be a str and its reward a finite real number (`finite_reward`, which the tool
environments use too), and whatever it raises becomes one line naming the environment and the
method, with the texts of its argument values hidden (`one_line`, `argument_strings`) — a
plugin's arguments may hold secrets. A KeyboardInterrupt the plugin raises itself is its failure;
a real Ctrl-C still stops the run. `validated_rows` runs the prompt and the reward on every
examples row before anything is written. This module does not import torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from twinrun.core import interrupts
from twinrun.core.errors import DataError
from twinrun.core.redact import REDACTED, redact_string
from twinrun.core.rng import Stream
from twinrun.rl.env_protocol import EnvironmentPluginError, SingleTurn


def one_line(text: object, hide: tuple[str, ...] = ()) -> str:
    """`text` on one line, every string in `hide` (argument values) replaced and URLs redacted."""
    line = " ".join(str(text).split())
    for value in sorted(hide, key=len, reverse=True):
        line = line.replace(value, REDACTED)
    return redact_string(line)


def argument_strings(value: Any) -> list[str]:
    """The texts an argument value can appear as in an exception message (str and repr of it and
    of every leaf of a list/dict); shorter than 3 characters they are left (`1`, `on`)."""
    if isinstance(value, Mapping):
        leaves = [s for v in value.values() for s in argument_strings(v)]
    elif isinstance(value, list | tuple):
        leaves = [s for v in value for s in argument_strings(v)]
    else:
        leaves = []
    texts = {str(value), repr(value), " ".join(str(value).split())} | set(leaves)
    return [t for t in texts if len(t) >= 3]


def hidden(env: object) -> tuple[str, ...]:
    """The texts of an environment's argument values (an adapted plugin's), to hide."""
    return getattr(env, "hidden_arguments", ())


def _plugin_call(name: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), where a KeyboardInterrupt the plugin raises itself is its failure (one line
    naming the environment) and a real Ctrl-C still stops the run: on the main thread a SIGINT
    handler notes every signal that arrives during the call (and passes it on to the handler
    before it); a KeyboardInterrupt with no SIGINT noted is the plugin's own."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    previous, noted = signal.getsignal(signal.SIGINT), []

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, note)
    try:
        with interrupts.abandonable():  # a SIGTERM (or Ctrl-C) asking the run to stop ends it
            return fn(*args)
    except KeyboardInterrupt as exc:
        if noted or isinstance(exc, interrupts.StopNow):
            raise
        raise EnvironmentPluginError(
            f"environment {name!r}: {what} raised KeyboardInterrupt itself (no Ctrl-C was given)",
            "an environment must not raise KeyboardInterrupt; fix the plugin",
        ) from None
    finally:
        signal.signal(signal.SIGINT, previous)


def _env_call(env: SingleTurn, name: str, method: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)`, a method of environment `name`; what it raises becomes one line naming the
    environment and the method (a row's DataError and the plugin's own interrupt pass)."""
    try:
        return _plugin_call(name, method, fn, *args)
    except (DataError, EnvironmentPluginError):  # DataError: a row's; this: its own interrupt
        raise
    except Exception as exc:
        raise EnvironmentPluginError(
            f"environment {name!r}: {method} raised {type(exc).__name__}: "
            f"{one_line(exc, hidden(env))}"
        ) from exc


def checked_prompt(env: SingleTurn, name: str, row: dict[str, Any], rng: Stream) -> str:
    """`env.prompt(row, rng)`, failing with a one-line error naming `name` unless it is a str."""
    prompt = _env_call(env, name, "prompt", env.prompt, row, rng)
    if not isinstance(prompt, str):
        raise EnvironmentPluginError(
            f"environment {name!r}: prompt returned {type(prompt).__name__}, not str"
        )
    return prompt


def finite_reward(
    value: Any,
    lead: str,
    error: type[EnvironmentPluginError] = EnvironmentPluginError,
    hint: str = "reward(row, completion) must return a finite float",
    hide: tuple[str, ...] | None = None,
) -> float:
    """Every environment's reward check: `value` as a Python float when it is a finite real
    number; else `error(f"{lead} {what}, not a [finite] float", hint)` (bool, str, None, NaN,
    ±inf and an int past float's range are refused). With `hide`, a value that is not a number
    is shown too (its repr, those texts hidden, at most 60 characters)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        seen = "" if hide is None else f" {one_line(repr(value), hide)[:60]}"
        raise error(f"{lead} {type(value).__name__}{seen}, not a float", hint)
    try:
        reward = float(value)
    except (OverflowError, ValueError, TypeError):  # an int past 1.8e308: 10**400
        reward = math.inf
    if not math.isfinite(reward):
        shown = f"{reward}" if isinstance(value, float) else f"{type(value).__name__} {reward}"
        raise error(f"{lead} {shown}, not a finite float", hint)
    return reward


def checked_reward(env: SingleTurn, name: str, row: dict[str, Any], completion: str) -> float:
    """`env.reward(row, completion)` as a Python float; a one-line error naming `name` when the
    reward raises or is not a finite real number (`finite_reward`)."""
    value = _env_call(env, name, "reward", env.reward, row, completion)
    return finite_reward(value, f"environment {name!r}: reward returned", hide=hidden(env))


def validated_rows(env: SingleTurn, name: str, rows: list[Any], seed: int) -> list[Any]:
    """Every examples row checked against the environment before any output exists: its prompt
    must build and its reward must score (an empty completion). The draws come from their own
    purpose ("validate"), so this changes no draw of the run."""
    from twinrun.core.rng import stream

    for i, row in enumerate(rows):
        data = dict(row.data)
        where = getattr(row, "where", f"row {i}")
        try:
            checked_prompt(env, name, data, stream(seed, "validate", i))
            checked_reward(env, name, data, "")
        except DataError as exc:
            raise type(exc)(f"{where}: {exc.message}", exc.hint) from None
    return rows
