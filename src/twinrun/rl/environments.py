"""GRPO environments (docs/training.md): what the model sees and how it is scored.

One protocol, `Environment`, is what GRPO samples: `episode(row, rng) -> Episode` is one
conversation (`start()` the first user message, `answer(text)` the reply to each model turn,
`reward()` the score once the episode is done, `close()`), and `one_turn` says whether the model
takes exactly one turn — then one episode serves a whole prompt group: its observation is made
once, and each sample's answer is scored (`reward()`) right after it. Multi-turn tool
environments (`tool_envs.py`) give one episode per rollout.

A single-turn environment is written in the simpler `SingleTurn` shape, two methods:

- `prompt(row, rng) -> str`: the observation the model sees for an examples row; `rng` is a
  twinrun stream keyed by (seed, step, prompt) for environments that randomise their observation.
- `reward(row, completion) -> float`: a finite float score for one sampled completion.

and is an `Environment` of one-turn episodes (`OneTurnEnvironment`, `OneTurnEpisode`): the
built-ins are, and a plugin's or reward source's object is adapted (`OneTurnAdapter`).
`environment_kind(name)` is the one reading of an environment name.

Built in:

- `arithmetic`: the prompt is `row["prompt"]`; reward 1.0 when the completion's first integer
  (optional leading whitespace, then `-?\\d+`) equals `int(row["answer"])`, else 0.0.
- `clock`: `arithmetic` with a wall-clock timestamp (`time.time_ns`) prefixed to the prompt — the
  model-visible nondeterminism that fixed seeds cannot remove and capture/replay can.

Reward sources from optional packages (`reward_sources`, imported only when named):
`reasoning_gym:NAME` scores with a reasoning-gym task, `math-verify` with math-verify's answer
check. These names are matched before the plugin rules below.

Plugins: `--env module.path:factory` imports the module and calls `factory(**args)`. A plugin is
code that runs with the user's rights, so it runs only where the user named it, and only code of
the user's own choosing runs. The rule, checked in this order:

1. the module is not in the standard library (`sys.stdlib_module_names`, e.g. `os`, `subprocess`,
   `builtins`) — refused before anything is imported, so `os:system` never runs;
2. the module resolves (`plugin_spec`: found by the import system's finders without executing
   any module; all `twinrun explain` checks, it never imports a plugin) and is trusted
   (`check_plugin_trust`, from the top-level package's spec and installed metadata, before any
   import): the user's own modules on the path are plugins; of twinrun's own modules only the
   factories it declares (`DECLARED_FACTORIES`) are — no module is trusted as a whole, so
   `twinrun.core.fileio:atomic_write_text` is refused; a built-in/frozen module or one under the
   standard library's directory is refused; a module of an installed distribution
   (`importlib.metadata.packages_distributions()` of its top-level package, or found under
   site-packages/dist-packages) is a plugin only when a distribution installed in the
   environment's site folders declares it under the `twinrun.environments` entry point group
   (`module:factory` or `module`), so `numpy:load` and `torch.serialization:load` are refused,
   and a forged `.dist-info` in the current directory or a relative `sys.path` entry declares
   nothing. The submodule of a package is
   located one level at a time with the finders, never by `importlib.util.find_spec` (which would
   import, and run, the parent package);
3. (`twinrun run` / `tune grpo` only) the module is imported, and `factory` must be a Python
   function or class *defined in that module* (`factory.__module__` is the module): a builtin or C
   function, a partial, or a callable imported from elsewhere (`from os import system`) is
   refused before it is called with any user argument;
4. `factory(**args)` must return an object with callable `prompt` and `reward`.

Every way a plugin can fail (import, missing attribute, factory raising, object without
prompt/reward, a reward that is not a finite float) is an `EnvironmentPluginError` (a
`ConfigError`) whose one line names the plugin. Argument values are never echoed (they may hold
secrets): an exception's text has every argument value replaced by `<redacted>`.

`observation_fault(prompt)` is the `--inject observation@STEP` hook: it prepends the same kind of
timestamp to any observation. This module does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import math
import numbers
import re
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

from twinrun.core import interrupts
from twinrun.core.errors import ConfigError, DataError
from twinrun.core.redact import REDACTED, redact_string
from twinrun.core.rng import Stream
from twinrun.rl.reward_sources import MATH_VERIFY, is_reward_source, make_reward_source

BUILTIN_ENVIRONMENTS = ("arithmetic", "clock")
TOOL_ENVIRONMENTS = ("calculator", "lookup")  # multi-turn, built in (tool_envs.py)

_LEADING_INT = re.compile(r"\s*(-?\d+)")
_PLUGIN = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class EnvironmentPluginError(ConfigError):
    """A plugin environment could not be built or returned something unusable."""


EnvironmentKind = Literal["builtin", "tool", "url", "reward-source", "plugin", "unknown"]
ONE_TURN_KINDS = ("builtin", "reward-source")  # single-turn by name
TOOL_KINDS = ("tool", "url")  # multi-turn by name; a plugin's turns are read from its code


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


def no_arguments(name: str, args: Mapping[str, Any] | None) -> None:
    """ConfigError when `args` are given to an environment that takes none: a built-in, a
    built-in tool environment, a URL, `math-verify` (plugins and reasoning-gym tasks take them)."""
    takes_none = environment_kind(name) in ("builtin", "tool", "url") or name == MATH_VERIFY
    if args and takes_none:
        raise ConfigError(
            f"environment {name!r} takes no arguments, got {sorted(args)}",
            "remove [environment.args] / --env-arg, or use a plugin environment",
        )


@dataclass(frozen=True)
class CallRecord:
    """One tool call the model made, and what came of it."""

    name: str
    arguments: Any  # the parsed arguments, or the raw text when malformed
    ok: bool
    result: str  # the tool's answer (text), or the one-line failure shown to the model


@dataclass(frozen=True)
class EnvReply:
    """The environment's reply to one model turn. When `done`, `messages` is empty."""

    messages: tuple[dict[str, str], ...]  # each {"role": "tool"|"user", "content": str}
    done: bool
    calls: tuple[CallRecord, ...] = ()


@runtime_checkable
class Episode(Protocol):
    """One conversation with a fresh environment instance."""

    tools: tuple[dict[str, Any], ...]  # JSON schemas offered to the model (may be empty)

    def start(self) -> str: ...  # the first user message (observation at turn 0)

    def answer(self, text: str) -> EnvReply: ...  # reply to the model's turn (decoded text)

    def reward(self) -> float: ...  # score once done (one-turn: of the last answer); finite

    def close(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    """What GRPO samples: episodes. `one_turn`: the model takes one turn, and one episode serves
    every sample of a prompt group (its observation made once, each answer scored right after
    it); otherwise each rollout has its own episode of up to `--max-turns` turns."""

    name: str
    one_turn: bool

    def episode(self, row: dict[str, Any], rng: Stream) -> Episode: ...


@runtime_checkable
class SingleTurn(Protocol):
    """How a single-turn environment is written (built-ins, plugins, reward sources)."""

    def prompt(self, row: dict[str, Any], rng: Stream) -> str: ...

    def reward(self, row: dict[str, Any], completion: str) -> float: ...


def _one_line(text: object, hide: tuple[str, ...] = ()) -> str:
    """`text` on one line, every string in `hide` (argument values) replaced and URLs redacted."""
    line = " ".join(str(text).split())
    for value in sorted(hide, key=len, reverse=True):
        line = line.replace(value, REDACTED)
    return redact_string(line)


def _argument_strings(value: Any) -> list[str]:
    """The texts an argument value can appear as in an exception message (str and repr of it and
    of every leaf of a list/dict); shorter than 3 characters they are left (`1`, `on`)."""
    if isinstance(value, Mapping):
        leaves = [s for v in value.values() for s in _argument_strings(v)]
    elif isinstance(value, list | tuple):
        leaves = [s for v in value for s in _argument_strings(v)]
    else:
        leaves = []
    texts = {str(value), repr(value), " ".join(str(value).split())} | set(leaves)
    return [t for t in texts if len(t) >= 3]


one_line = _one_line  # the public names the tool environments use
argument_strings = _argument_strings


def _hidden(env: object) -> tuple[str, ...]:
    return getattr(env, "hidden_arguments", ())


class OneTurnEpisode:
    """A single-turn environment's episode of one prompt group: `start()` is its observation
    (`prompt(row, rng)`, checked), every `answer` ends the episode, and `reward()` scores the
    last answer (`reward(row, completion)`, checked) — each sample of the group answers, then is
    scored, in turn. Nothing to close."""

    tools: tuple[dict[str, Any], ...] = ()

    def __init__(self, env: SingleTurn, name: str, row: dict[str, Any], rng: Stream) -> None:
        self.env, self.name, self.row, self.rng = env, name, row, rng
        self.scored = dict(row)  # the rewards' copy of the row (the prompt gets its own)
        self.final = ""

    def start(self) -> str:
        return checked_prompt(self.env, self.name, dict(self.row), self.rng)

    def answer(self, text: str) -> EnvReply:
        self.final = text
        return EnvReply((), True)

    def reward(self) -> float:
        return checked_reward(self.env, self.name, self.scored, self.final)

    def close(self) -> None:
        pass


class OneTurnEnvironment(ABC):
    """A `SingleTurn` environment as the `Environment` protocol: one-turn episodes, each over a
    fresh instance (`renew`: GRPO makes one per prompt group, so an environment that keeps
    state between calls cannot carry it from one group — or one process — to another)."""

    name = ""
    one_turn = True

    @abstractmethod
    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        """The observation of `row`, drawing from `rng` only."""

    @abstractmethod
    def reward(self, row: dict[str, Any], completion: str) -> float:
        """The completion's reward (a finite number)."""

    def renew(self) -> OneTurnEnvironment:
        """An instance with no state from earlier calls (built-ins keep none: themselves)."""
        return self

    def episode(self, row: dict[str, Any], rng: Stream) -> OneTurnEpisode:
        return OneTurnEpisode(self.renew(), self.name, row, rng)


class OneTurnAdapter(OneTurnEnvironment):
    """A plugin's or reward source's `SingleTurn` object with the texts of its arguments (never
    echoed in errors), and how to make another (`renew`: the factory, called again)."""

    def __init__(
        self,
        inner: Any,
        hidden_arguments: tuple[str, ...],
        renew: Callable[[], Any] | None = None,
        name: str = "",
    ) -> None:
        self.inner = inner
        self.hidden_arguments = hidden_arguments
        self._renew = renew
        self.name = name or str(getattr(inner, "name", ""))

    def renew(self) -> OneTurnAdapter:
        """A fresh instance made by the factory, with the same arguments."""
        return self if self._renew is None else self._renew()

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return self.inner.prompt(row, rng)

    def reward(self, row: dict[str, Any], completion: str) -> float:
        return self.inner.reward(row, completion)


def wall_clock_stamp() -> str:
    """`[time 2026-11-30T09:12:33.123456] ` from `time.time_ns()` (UTC, microseconds)."""
    ns = time.time_ns()
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=rest // 1000)
    return f"[time {stamp.strftime('%Y-%m-%dT%H:%M:%S.%f')}] "


def observation_fault(prompt: str) -> str:
    """The `observation` fault: the observation with a wall-clock timestamp prepended."""
    return wall_clock_stamp() + prompt


def _field(row: Mapping[str, Any], key: str, env: str) -> Any:
    if key not in row:
        raise DataError(
            f"environment {env!r}: examples row has no {key!r} field (keys: {sorted(row)})",
            f"every row needs {key!r} for --env {env}",
        )
    return row[key]


def first_integer(completion: str) -> int | None:
    """The integer the completion starts with (after optional whitespace), or None."""
    match = _LEADING_INT.match(completion)
    return int(match.group(1)) if match else None


def arithmetic_reward(row: Mapping[str, Any], completion: str, env: str) -> float:
    """1.0 iff `completion` (a single-turn completion, a tool episode's final model turn) starts
    with int(row["answer"]), else 0.0; a DataError naming the environment when the row has no
    integer answer."""
    raw = _field(row, "answer", env)
    try:
        answer = int(str(raw).strip())
    except ValueError:
        raise DataError(f"environment {env!r}: 'answer' {raw!r} is not an integer") from None
    return 1.0 if first_integer(completion) == answer else 0.0


class ArithmeticEnvironment(OneTurnEnvironment):
    """Exact-integer-answer environment: reward 1.0 iff the completion starts with the answer."""

    name = "arithmetic"

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        prompt = _field(row, "prompt", self.name)
        if not isinstance(prompt, str):
            raise DataError(f"environment {self.name!r}: 'prompt' must be a string")
        return prompt

    def reward(self, row: dict[str, Any], completion: str) -> float:
        return arithmetic_reward(row, completion, self.name)


class ClockEnvironment(ArithmeticEnvironment):
    """`arithmetic` whose observation starts with the wall-clock time: never reproducible."""

    name = "clock"

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return wall_clock_stamp() + super().prompt(row, rng)


_BUILTINS: dict[str, type[ArithmeticEnvironment]] = {
    "arithmetic": ArithmeticEnvironment,
    "clock": ClockEnvironment,
}


def _check_methods(obj: object, name: str) -> None:
    missing = [m for m in ("prompt", "reward") if not callable(getattr(obj, m, None))]
    if missing:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: factory returned {type(obj).__name__}, which has no "
            f"callable {' or '.join(missing)}",
            "return an object with prompt(row, rng) -> str and reward(row, completion) -> float",
        )


def check_plugin_name(name: str, args: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """Rules 1 and 2 for a plugin `module.path:factory`: the form, the argument names, not the
    standard library, and the module resolves — without importing or running anything. Returns
    (module, factory)."""
    if not _PLUGIN.match(name):
        raise EnvironmentPluginError(
            f"environment plugin {name!r} is not of the form module.path:factory",
            "e.g. --env mypkg.envs:make_env",
        )
    bad_keys = [k for k in args or {} if not isinstance(k, str) or not k.isidentifier()]
    if bad_keys:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: argument names must be identifiers, got {bad_keys}"
        )
    module_name, factory_name = name.split(":")
    top = module_name.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {top!r} is part of Python's standard library, not an "
            "environment plugin (a plugin is code that runs with your rights)",
            "name a factory defined in your own module, e.g. --env mypkg.envs:make_env",
        )
    top_spec = plugin_spec(top)
    if top_spec is None or plugin_spec(module_name) is None:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: cannot find module {module_name!r}",
            "check that the module is importable (installed or on PYTHONPATH)",
        )
    check_plugin_trust(name, module_name, factory_name, top_spec)
    return module_name, factory_name


ENTRY_POINT_GROUP = "twinrun.environments"
# twinrun's own factories that are environments (the golden suite's); every other function of a
# twinrun module is refused as a plugin, however harmless its module looks
DECLARED_FACTORIES = frozenset({"twinrun.golden.shaped_env:make"})


def _under(path: str, roots: set[str]) -> bool:
    import os

    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots if r)


def _installed_roots() -> tuple[set[str], set[str]]:
    """(the standard library's directories, the directories installed packages live in)."""
    import os
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    installed = {os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)}
    try:
        installed |= {os.path.realpath(p) for p in site.getsitepackages()}
    except AttributeError:  # a virtualenv's old site module
        pass
    installed |= {
        os.path.realpath(p)
        for p in sys.path
        if p
        and os.path.isabs(p)
        and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages")
    }
    return stdlib, installed


def _installed_entry_points(installed: set[str]) -> list[Any]:
    """The `twinrun.environments` entry points of distributions installed in the environment's
    site folders: a distribution found in the current directory, a relative `sys.path` entry or
    anywhere else on the path declares nothing (a forged `.dist-info` beside the user's files
    would otherwise name `numpy:load` a plugin)."""
    import os
    from importlib import metadata

    cwd = os.path.realpath(os.getcwd())
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if dist is None:
            continue
        try:
            where = os.path.realpath(str(dist.locate_file("")))
        except Exception:  # a distribution of another kind, with no location
            continue
        if where != cwd and _under(where, installed):
            found.append(ep)
    return found


def check_plugin_trust(
    name: str, module_name: str, factory_name: str, top_spec: importlib.machinery.ModuleSpec
) -> None:
    """Rule 1b, checked from the top-level package's spec and the installed metadata, before
    any module is imported: a plugin is twinrun's own, or the user's own module on the path, or a
    module an installed distribution declares under the `twinrun.environments` entry point
    group. Refused: a built-in or frozen module, a module under the standard library's directory,
    and a module of an installed distribution (`importlib.metadata.packages_distributions()` of
    its top-level package, or a module under site-packages/dist-packages) that has no such entry
    point naming it (`numpy:load`, `torch.serialization:load`)."""
    from importlib import metadata

    top = module_name.split(".")[0]
    if top == "twinrun":
        if f"{module_name}:{factory_name}" in DECLARED_FACTORIES:
            return
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: twinrun's own modules are not plugins (only the "
            "environments it declares are, by name)",
            f"name a built-in environment ({', '.join(BUILTIN_ENVIRONMENTS + TOOL_ENVIRONMENTS)})"
            " or a factory defined in your own module",
        )
    origin = top_spec.origin or ""
    locations = list(top_spec.submodule_search_locations or ())
    where = [origin] if origin and origin not in ("built-in", "frozen") else []
    where += locations
    stdlib, installed = _installed_roots()
    if origin in ("built-in", "frozen") or (
        where and all(_under(p, stdlib) and not _under(p, installed) for p in where)
    ):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {top!r} is part of Python's standard library, not an "
            "environment plugin (a plugin is code that runs with your rights)",
            "name a factory defined in your own module, e.g. --env mypkg.envs:make_env",
        )
    try:
        dists = sorted(set(metadata.packages_distributions().get(top, ())))
    except Exception:  # broken metadata of some other distribution
        dists = []
    if not dists and not any(_under(p, installed) for p in where):
        return  # the user's own module on the path
    for ep in _installed_entry_points(installed):
        dist_name = ep.dist.name if ep.dist is not None else None
        if dists and dist_name not in dists:
            continue
        if ep.module == module_name and ep.attr in (None, factory_name):
            return
    owner = f"distribution {', '.join(dists)!s}" if dists else "an installed package"
    raise EnvironmentPluginError(
        f"environment plugin {name!r}: module {module_name!r} belongs to {owner}, which does "
        f"not declare it under the {ENTRY_POINT_GROUP!r} entry point group",
        f"an installed package is a plugin only when it declares [project.entry-points."
        f'"{ENTRY_POINT_GROUP}"] naming {module_name}:{factory_name}; or put your own module '
        "on PYTHONPATH",
    )


def plugin_spec(module_name: str) -> importlib.machinery.ModuleSpec | None:
    """Where `module_name` would be imported from, or None — found by `sys.meta_path`'s finders
    one package level at a time, so no package's `__init__` runs (importlib.util.find_spec would
    import the parent packages of a dotted name)."""
    spec: importlib.machinery.ModuleSpec | None = None
    path: Any = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        loaded = sys.modules.get(full)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(full, path) if find is not None else None
                if spec is not None:
                    break
        if spec is None:
            return None
        path = spec.submodule_search_locations
        if path is None and i < len(parts) - 1:
            return None  # a module, not a package: it has no submodules
    return spec


def _check_factory(name: str, module_name: str, factory_name: str, factory: Any) -> None:
    """Rule 3: a Python function or class defined in the named module."""
    if not callable(factory):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is a {type(factory).__name__}, "
            "not callable"
        )
    if not (inspect.isfunction(factory) or inspect.isclass(factory)):
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is a {type(factory).__name__}, not "
            "a Python function or class",
            "define a factory function or class in the plugin module",
        )
    if getattr(factory, "__module__", None) != module_name:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: {factory_name!r} is defined in "
            f"{getattr(factory, '__module__', None)!r}, not in {module_name!r}",
            "name a factory defined in the plugin module itself, not one it imports",
        )


def load_plugin_factory(
    name: str, args: Mapping[str, Any] | None
) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """Rules 1 to 3 for a plugin `module.path:factory`: the module is imported and the factory
    found and checked, never called. Returns (factory, the texts of the argument values to hide
    in every error line). Every failure is an EnvironmentPluginError naming the plugin."""
    module_name, factory_name = check_plugin_name(name, args)
    hide = tuple(t for v in (args or {}).values() for t in _argument_strings(v))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import can fail in any way the module's code can
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: cannot import module {module_name!r}: "
            f"{type(exc).__name__}: {_one_line(exc, hide)}",
            "check that the module is importable (installed or on PYTHONPATH)",
        ) from exc
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise EnvironmentPluginError(
            f"environment plugin {name!r}: module {module_name!r} has no attribute "
            f"{factory_name!r}",
            "name a factory function or class defined in that module",
        )
    _check_factory(name, module_name, factory_name, factory)
    return factory, hide


def make_environment(name: str, args: Mapping[str, Any] | None = None) -> OneTurnEnvironment:
    """A single-turn environment: a built-in by name, a reward source (`reasoning_gym:NAME`,
    `math-verify`: `reward_sources`), or a plugin `module.path:factory` made by factory(**args)
    (the module's rules above, checked before the module is imported and before the factory is
    called), as one-turn episodes.

    Raises ConfigError for an unknown name or arguments to a built-in, EnvironmentPluginError
    (a ConfigError) for every plugin failure."""
    args = dict(args or {})
    kind = environment_kind(name)
    no_arguments(name, args)
    if kind == "builtin":
        return _BUILTINS[name]()
    if kind == "reward-source":
        return OneTurnAdapter(make_reward_source(name, args), (), None, name)
    if kind != "plugin":
        raise ConfigError(
            f"unknown environment {name!r}",
            f"choose from {', '.join(BUILTIN_ENVIRONMENTS)}, math-verify, reasoning_gym:TASK, "
            "or a plugin as module.path:factory (multi-turn: calculator, lookup)",
        )
    factory, hide = load_plugin_factory(name, args)

    def build() -> OneTurnAdapter:
        try:
            env = factory(**args)
        except Exception as exc:
            raise EnvironmentPluginError(
                f"environment plugin {name!r}: factory raised {type(exc).__name__}: "
                f"{_one_line(exc, hide)}",
                "check [environment.args] / --env-arg against the factory's parameters",
            ) from exc
        _check_methods(env, name)
        return OneTurnAdapter(env, hide, build, name)

    return build()


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
            f"{_one_line(exc, _hidden(env))}"
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
        seen = "" if hide is None else f" {_one_line(repr(value), hide)[:60]}"
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
    return finite_reward(value, f"environment {name!r}: reward returned", hide=_hidden(env))


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
