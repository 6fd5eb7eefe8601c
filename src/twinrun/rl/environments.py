"""GRPO environments by name (docs/training.md, docs/tool-environments.md): the one reading of an
environment name (`environment_kind`) and the one factory, `open_environment`.

`open_environment(name, args, max_turns=, timeout_s=)` classifies the name once and gives an
`Environment` (`env_protocol.py`) whose `plan` says how its episodes are sampled:

- single-turn (plan `ONE_TURN`): a built-in (`arithmetic`, `clock`: `builtin_envs.py`), a reward
  source of an optional package (`reasoning_gym:NAME`, `math-verify`: `reward_sources.py`,
  imported only when named, matched before the plugin rule), or a plugin whose factory makes an
  object with `prompt` and `reward` (`single_turn.py`);
- with tool turns, up to `max_turns`, every call into its code under `timeout_s`: a built-in
  (`calculator`, `lookup`: `tool_envs.py`), an OpenEnv server on the loopback interface
  (`http://127.0.0.1:PORT`), or a plugin of the TRL, OpenEnv or MCP shape (`tool_plugins.py`).

A plugin `module.path:factory` is located and trusted before it is imported, and its factory
checked before it is called (`plugin_trust.py`); its shape is read once — from the class, or
from what a function factory returns when called once. The turn and time limits are checked
against the kind once it is known (`tool_settings.tool_limits`, the one check that requires
them): a tool environment needs both, a single-turn one takes neither. This module does not
import torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

from twinrun.core.errors import ConfigError
from twinrun.rl.builtin_envs import BUILTIN_ENVIRONMENTS, BUILTINS
from twinrun.rl.env_checks import one_line
from twinrun.rl.env_protocol import Environment, EnvironmentPluginError
from twinrun.rl.plugin_trust import load_plugin_factory
from twinrun.rl.reward_sources import MATH_VERIFY, is_reward_source, make_reward_source
from twinrun.rl.single_turn import OneTurnAdapter
from twinrun.rl.tool_base import Guard
from twinrun.rl.tool_envs import TOOL_ENVIRONMENTS, BuiltinToolEnvironment
from twinrun.rl.tool_plugins import HttpToolEnvironment, PluginToolEnvironment, shape_of
from twinrun.rl.tool_settings import check_limit_values, tool_limits

EnvironmentKind = Literal["builtin", "tool", "url", "reward-source", "plugin", "unknown"]
SHAPES = (
    "prompt(row, rng) and reward(row, completion) (single-turn), reset() and tool methods "
    "(TRL), reset() and step(action) (OpenEnv), list_tools() and call_tool(name, arguments) (MCP)"
)


def environment_kind(name: str) -> EnvironmentKind:
    """What an environment name names, from its text alone (nothing is imported or called):
    "builtin" (`arithmetic`, `clock`), "tool" (`calculator`, `lookup`), "url" (an OpenEnv
    server: anything with `://`; only loopback http(s) is served), "reward-source"
    (`math-verify`, `reasoning_gym:TASK`), "plugin" (`module.path:factory`, its form checked
    when it is located; single-turn or multi-turn by its shape), else "unknown"."""
    if name in BUILTIN_ENVIRONMENTS:
        return "builtin"
    if name in TOOL_ENVIRONMENTS:
        return "tool"
    if "://" in name:
        return "url"
    if is_reward_source(name):
        return "reward-source"
    return "plugin" if ":" in name else "unknown"


def no_arguments(name: str, kind: EnvironmentKind, args: Mapping[str, Any]) -> None:
    """ConfigError when `args` are given to an environment that takes none: a built-in, a
    built-in tool environment, a URL, `math-verify` (plugins and reasoning-gym tasks take them)."""
    takes_none = kind in ("builtin", "tool", "url") or name == MATH_VERIFY
    if args and takes_none:
        raise ConfigError(
            f"environment {name!r} takes no arguments, got {sorted(args)}",
            "remove [environment.args] / --env-arg, or use a plugin environment",
        )


def open_environment(
    name: str,
    args: Mapping[str, Any] | None = None,
    *,
    max_turns: int | None = None,
    timeout_s: float | None = None,
) -> Environment:
    """The environment `name`, with `args` for a plugin or reasoning-gym task; `max_turns` and
    `timeout_s` (`--max-turns`, `--tool-timeout`) are a tool environment's limits, and a
    single-turn environment is given neither. ConfigError for an unknown name, arguments to an
    environment that takes none, or limits that do not fit its kind; EnvironmentPluginError
    (a ConfigError) for every failure of a plugin or of the environment's own code."""
    args = dict(args or {})
    kind = environment_kind(name)
    no_arguments(name, kind, args)
    check_limit_values(name, max_turns, timeout_s)  # before any of the environment's code runs
    if kind == "plugin":
        return _open_plugin(name, args, max_turns, timeout_s)
    if kind == "unknown":
        raise ConfigError(
            f"unknown environment {name!r}",
            f"choose from {', '.join(BUILTIN_ENVIRONMENTS)}, math-verify, reasoning_gym:TASK "
            f"(single-turn), {', '.join(TOOL_ENVIRONMENTS)}, http://127.0.0.1:PORT (tools), or a "
            "plugin as module.path:factory",
        )
    limits = tool_limits(name, kind in ("tool", "url"), max_turns, timeout_s)
    if limits is None:
        if kind == "builtin":
            return BUILTINS[name]()
        return OneTurnAdapter(make_reward_source(name, args), (), None, name)
    if kind == "tool":
        return BuiltinToolEnvironment(name, limits)
    return HttpToolEnvironment(name, limits)  # http(s) on loopback; any other URL is refused


def _open_plugin(
    name: str, args: dict[str, Any], max_turns: int | None, timeout_s: float | None
) -> Environment:
    """A plugin `module.path:factory`, by its shape: read from a class factory, or from what a
    function factory returns when called once (under `timeout_s` when the run gives one; without
    it, as a single-turn factory is always called). A single-turn object is adapted (the first
    one serves the row checks; each prompt group gets a fresh one); a tool shape's first object
    is closed and dropped, and each rollout calls the factory again, under the time limit."""
    factory, hide = load_plugin_factory(name, args)
    probed = not inspect.isclass(factory)
    first = _call_plugin_code(name, "factory", factory, hide, timeout_s, **args) if probed else None
    shape = shape_of(first if probed else factory)
    if shape is None:
        made = f"object ({type(first).__name__})" if probed else f"class {factory.__name__}"
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: the factory's {made} has none of the shapes: {SHAPES}",
            "see docs/tool-environments.md",
        )
    close = getattr(first, "close", None)
    if probed and shape != "single-turn" and callable(close):  # the probe of a tool shape
        _call_plugin_code(name, "close", close, hide, timeout_s)
    limits = tool_limits(name, shape != "single-turn", max_turns, timeout_s)
    if limits is not None:
        guard = Guard(name, limits.timeout_s, hide)
        return PluginToolEnvironment(name, factory, args, guard, shape, limits.max_turns)

    def build(made: Any = None) -> OneTurnAdapter:
        env = (
            made
            if made is not None
            else _call_plugin_code(name, "factory", factory, hide, None, **args)
        )
        check_methods(env, name)
        return OneTurnAdapter(env, hide, build, name)

    return build(first)


def _call_plugin_code(
    name: str, what: str, fn: Callable[..., Any], hide: tuple[str, ...], timeout_s: float | None,
    /, **kwargs: Any,
) -> Any:  # fmt: skip
    """fn(**kwargs), a plugin's own code, run before its kind is known or for a single-turn
    plugin: under `timeout_s` when given (`Guard`), else called as a single-turn environment's
    code is. Every failure is one line naming the plugin, argument values hidden."""
    if timeout_s is not None:
        return Guard(name, timeout_s, hide).call(what, fn, **kwargs)
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {what} raised {type(exc).__name__}: "
            f"{one_line(exc, hide)}",
            "check [environment.args] / --env-arg against the factory's parameters",
        ) from exc


def check_methods(obj: object, name: str) -> None:
    """An EnvironmentPluginError unless a single-turn plugin's object has callable `prompt` and
    `reward`."""
    missing = [m for m in ("prompt", "reward") if not callable(getattr(obj, m, None))]
    if missing:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: factory returned {type(obj).__name__}, which has no "
            f"callable {' or '.join(missing)}",
            "return an object with prompt(row, rng) -> str and reward(row, completion) -> float",
        )
