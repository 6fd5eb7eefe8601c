"""Tool environments of the user's own code (docs/tool-environments.md): a plugin
`module.path:factory` in one of three shapes, or an OpenEnv server on the loopback interface.

The shape is read from the factory (a class) or from what it returns (a function, called once
to see, and that object closed and dropped):

1. `trl`: TRL's `environment_factory` — `reset(**row)` and public methods that are the tools;
2. `openenv`: `reset()` and `step(action)`, where the action is the model's turn as text;
3. `mcp`: `list_tools()` and `call_tool(name, arguments)`.

An object with `prompt` and `reward` is a single-turn environment (`single_turn.py`), not one
of these; `open_environment` (`environments.py`) reads the shape once. The factory runs once per
rollout, so no state passes from one rollout to the next.
This module does not import torch, nor any package of the environments it adapts.
"""

from __future__ import annotations

import dataclasses
import inspect
import ipaddress
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from twinrun.core.errors import ConfigError, DataError
from twinrun.core.jsonlimits import SMALL, parse_json
from twinrun.core.redact import redact_string
from twinrun.core.rng import Stream
from twinrun.rl.env_protocol import EnvReply, TurnPlan
from twinrun.rl.tool_base import (
    Guard,
    Toolbox,
    ToolEnvironmentError,
    ToolFailed,
    reward_of,
    row_kwargs,
    row_prompt,
    tool_messages,
)
from twinrun.rl.tool_calls import parse_tool_calls, tool_schema
from twinrun.rl.tool_settings import ToolLimits

NOT_TOOLS = ("reset", "reward", "close")  # public methods of a TRL class that are not tools
MAX_RESPONSE_BYTES = 4 << 20  # one HTTP answer


def shape_of(obj: Any) -> str | None:
    """ "single-turn", "mcp", "openenv", "trl" for a class or an object, or None."""

    def has(name: str) -> bool:
        return callable(getattr(obj, name, None))

    if has("prompt") and has("reward"):
        return "single-turn"
    if has("list_tools") and has("call_tool"):
        return "mcp"
    if has("reset") and has("step"):
        return "openenv"
    if has("reset"):
        return "trl"
    return None


class _PluginEpisode:
    """What the shapes share: the instance, the row, the final model turn, close — and the tool
    shapes' turns (TRL, MCP): `reset` (or the row's prompt) starts the episode, a model turn with
    tool calls is answered by `toolbox`, one without ends it. OpenEnv overrides both."""

    def __init__(self, guard: Guard, obj: Any, row: dict[str, Any], rng: Stream) -> None:
        self.guard, self.obj, self.row, self.rng = guard, obj, row, rng
        self.final = ""
        self.closed = False
        self.tools: tuple[dict[str, Any], ...] = ()
        self.toolbox: Toolbox | None = None  # set by the tool shapes

    def start(self) -> str:
        first = self._reset()
        return (
            row_prompt(self.row, self.guard.env)
            if first is None
            else self.guard.text("reset", first)
        )

    def answer(self, text: str) -> EnvReply:
        assert self.toolbox is not None  # every tool shape sets one
        self.final = text
        calls = parse_tool_calls(text)
        if not calls:
            return EnvReply((), True)
        records = [self.toolbox.run(c) for c in calls]
        return EnvReply(tool_messages(records), False, tuple(records))

    def _reset(self) -> Any:
        reset = getattr(self.obj, "reset", None)
        if not callable(reset):
            return None
        return self.guard.call("reset", reset, **row_kwargs(reset, self.row, self.rng))

    def reward(self) -> float:
        return reward_of(self.guard, self.obj, self.row, self.final)

    def close(self) -> None:
        close = getattr(self.obj, "close", None)
        if not self.closed and callable(close):
            self.closed = True
            self.guard.call("close", close)
        self.closed = True


class TrlEpisode(_PluginEpisode):
    """Shape 1: the public methods are the tools; a turn without a tool call ends the episode."""

    def __init__(self, guard: Guard, obj: Any, row: dict[str, Any], rng: Stream) -> None:
        super().__init__(guard, obj, row, rng)
        methods: dict[str, Callable[..., Any]] = {}
        for name in dir(type(obj)):
            attr = inspect.getattr_static(type(obj), name)
            if name.startswith("_") or name in NOT_TOOLS:
                continue
            if inspect.isfunction(attr) or isinstance(attr, staticmethod):
                methods[name] = getattr(obj, name)
        try:
            self.tools = tuple(tool_schema(fn, name) for name, fn in methods.items())
        except ConfigError as exc:
            raise ToolEnvironmentError(
                f"environment {guard.env!r}: {exc.message}", exc.hint
            ) from None
        self.toolbox = Toolbox(
            guard, self.tools, lambda name, args: methods[name](**args),
            {name: inspect.signature(fn) for name, fn in methods.items()},
        )  # fmt: skip


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def observation_text(guard: Guard, what: str, obs: Any) -> str | None:
    """An observation as text: None; a str; a dict's or object's `text`/`message`/`content`
    string; else the canonical JSON of a dict, a dataclass or a pydantic model."""
    if obs is None or isinstance(obs, str):
        return None if obs is None else guard.text(f"{what} observation", obs)
    for key in ("text", "message", "content"):
        if isinstance(_field(obs, key), str):
            return guard.text(f"{what} observation", str(_field(obs, key)))
    if dataclasses.is_dataclass(obs) and not isinstance(obs, type):
        try:
            obs = dataclasses.asdict(obs)
        except RecursionError:
            raise ToolEnvironmentError(
                f"environment {guard.env!r}: {what} observation is nested deeper than "
                "Python can walk (or is circular)",
                "return plain JSON values, nested a few levels",
            ) from None
    elif callable(getattr(obs, "model_dump", None)):
        obs = guard.call(f"{what} observation's model_dump", obs.model_dump)
    return guard.text(f"{what} observation", obs)


def step_result(guard: Guard, what: str, value: Any) -> tuple[str | None, float | None, bool]:
    """(observation text, reward, done) of a reset/step answer: a dict or an object with
    `observation`, `reward`, `done`, or (reset) the observation itself."""
    if isinstance(value, Mapping) or hasattr(value, "observation"):
        obs, reward, done = (_field(value, k) for k in ("observation", "reward", "done"))
    else:
        obs, reward, done = value, None, False
    if done is None:
        done = False
    if not isinstance(done, bool | int):
        raise ToolEnvironmentError(
            f"environment {guard.env!r}: {what} answered done={type(done).__name__}, not a bool"
        )
    score = None if reward is None else guard.reward(reward, f"{what}'s reward")
    return observation_text(guard, what, obs), score, bool(done)


class OpenEnvEpisode(_PluginEpisode):
    """Shape 2 (and the HTTP server): `step(text)` per model turn; replies are user messages;
    the reward is the sum of the step rewards."""

    def __init__(self, guard: Guard, obj: Any, row: dict[str, Any], rng: Stream) -> None:
        super().__init__(guard, obj, row, rng)
        self.total = 0.0

    def _step(self, text: str) -> Any:
        return self.guard.call("step", self.obj.step, text)

    def start(self) -> str:
        first, _, _ = step_result(self.guard, "reset", self._reset())
        return row_prompt(self.row, self.guard.env) if first is None else first

    def answer(self, text: str) -> EnvReply:
        self.final = text
        obs, reward, done = step_result(self.guard, "step", self._step(text))
        self.total += reward or 0.0
        if done:
            return EnvReply((), True)
        return EnvReply(({"role": "user", "content": obs or ""},), False)

    def reward(self) -> float:
        return self.guard.reward(self.total)


def _mcp_result(value: Any) -> Any:
    """An MCP CallToolResult (or its dict): its text contents joined; isError fails the call."""
    content = _field(value, "content") if not isinstance(value, str | list) else None
    if not isinstance(content, list):
        return value
    text = "\n".join(str(_field(c, "text")) for c in content if isinstance(_field(c, "text"), str))
    if _field(value, "isError") is True:
        raise ToolFailed(text)
    return text


def _plain_json(guard: Guard, name: str, schema: Any) -> None:
    """A ToolEnvironmentError unless a tool's input schema (walked safely already) is plain
    JSON: it reaches the chat template and the run's records, which hold no NaN or Infinity."""
    try:
        json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError):
        raise ToolEnvironmentError(
            f"environment {guard.env!r}: list_tools schema of tool {name[:60]!r} holds NaN, "
            "Infinity or a value that is not JSON",
            "give each input schema plain JSON values (finite numbers, strings, lists, objects)",
        ) from None


class McpEpisode(_PluginEpisode):
    """Shape 3: the tools are `list_tools()`; each call goes to `call_tool(name, arguments)`."""

    def __init__(self, guard: Guard, obj: Any, row: dict[str, Any], rng: Stream) -> None:
        super().__init__(guard, obj, row, rng)
        listed = guard.call("list_tools", obj.list_tools)
        if not isinstance(listed, list | tuple):
            listed = _field(listed, "tools")
        if not isinstance(listed, list | tuple):
            raise ToolEnvironmentError(
                f"environment {guard.env!r}: list_tools did not return a list"
            )
        guard.shallow("list_tools answer", listed)  # before any schema is walked or serialized
        schemas = []
        for tool in listed:
            name, desc = _field(tool, "name"), _field(tool, "description")
            params = _field(tool, "inputSchema") or _field(tool, "input_schema")
            if not isinstance(name, str) or not isinstance(params or {}, Mapping):
                raise ToolEnvironmentError(
                    f"environment {guard.env!r}: list_tools gave a tool without a name string "
                    "or with an input schema that is not an object"
                )
            guard.shallow(f"list_tools schema of tool {name[:60]!r}", params)
            _plain_json(guard, name, params)
            function = {
                "name": name,
                "description": desc if isinstance(desc, str) else "",
                "parameters": dict(params or {"type": "object", "properties": {}}),
            }
            schemas.append({"type": "function", "function": function})
        self.tools = tuple(schemas)
        self.toolbox = Toolbox(guard, self.tools, lambda n, a: _mcp_result(obj.call_tool(n, a)))


EPISODES: dict[str, type[_PluginEpisode]] = {
    "trl": TrlEpisode, "openenv": OpenEnvEpisode, "mcp": McpEpisode,
}  # fmt: skip


class PluginToolEnvironment:
    """A plugin's factory, called under the time limit once per rollout."""

    def __init__(self, name: str, factory: Callable[..., Any], args: Mapping[str, Any],
                 guard: Guard, shape: str, max_turns: int) -> None:  # fmt: skip
        self.name, self.factory, self.args, self.guard, self.shape = (
            name, factory, args, guard, shape,
        )  # fmt: skip
        self.plan = TurnPlan(max_turns, tool_turns=True)

    def episode(self, row: dict[str, Any], rng: Stream) -> _PluginEpisode:
        obj = self.guard.call("factory", self.factory, **self.args)
        if shape_of(obj) != self.shape:
            raise ToolEnvironmentError(
                f"environment {self.name!r}: the factory returned a {type(obj).__name__} that "
                f"is not of the {self.shape} shape it had before"
            )
        return EPISODES[self.shape](self.guard, obj, row, rng)

    def check_rows(self, rows: list[Any], seed: int) -> None:
        """Nothing: a plugin reads its rows its own way."""


# --- OpenEnv over HTTP, on the loopback interface only ------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self, *args: Any, **kwargs: Any
    ) -> None:  # a redirect could leave loopback
        return None


def loopback_url(url: str) -> str:
    """The base URL (no trailing /) when it is http(s) on 127.0.0.0/8, ::1 or localhost."""
    shown = redact_string(url)
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        raise ToolEnvironmentError(f"environment {shown!r}: not a valid URL") from None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme not in ("http", "https") or not loopback:
        raise ToolEnvironmentError(
            f"environment {shown!r}: only the loopback interface can serve an environment "
            "(http://127.0.0.1:PORT, http://localhost:PORT or http://[::1]:PORT)",
            "run the environment server on this machine and name it by its loopback address",
        )
    odd = "\\" in url or any(c in parts.netloc for c in "@%") or parts.query or parts.fragment
    if odd or not url.isascii() or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise ToolEnvironmentError(
            f"environment {shown!r}: a URL with user info, a backslash, %-escapes, a query, a "
            "fragment, spaces or non-ASCII characters is refused (a check and an HTTP client could "
            "read it as different hosts)",
            "name the server as http://127.0.0.1:PORT (or localhost, or [::1]) and a path",
        )
    # rebuilt from the parts that were checked: the client connects to exactly that host
    netloc = f"[{host}]" if ":" in host else host
    netloc += "" if port is None else f":{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


class HttpEnvironmentClient:
    """The server's reset and step, as OpenEnvEpisode calls them on an in-process object."""

    def __init__(self, base: str, guard: Guard) -> None:
        self.base, self.guard = base, guard
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        what, env = f"POST {path}", self.guard.env
        request = urllib.request.Request(
            self.base + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )  # fmt: skip
        try:
            with self.opener.open(request, timeout=self.guard.timeout_s) as response:
                data = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ToolEnvironmentError(
                f"environment {env!r}: {what} answered HTTP {exc.code} "
                f"{self.guard.line(exc.reason)}"
            ) from None
        except TimeoutError:
            raise self.guard.late(what) from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise ToolEnvironmentError(
                f"environment {env!r}: {what} failed: {type(why).__name__}: {self.guard.line(why)}",
                "check that the environment server is running on that port",
            ) from None
        if len(data) > MAX_RESPONSE_BYTES:
            raise ToolEnvironmentError(
                f"environment {env!r}: {what} answered more than {MAX_RESPONSE_BYTES} bytes"
            )
        try:
            return parse_json(data, f"{what} answer", SMALL)
        except DataError as exc:
            raise ToolEnvironmentError(f"environment {env!r}: {exc.message}") from None

    def reset(self) -> Any:
        return self._post("/reset", {})

    def step(self, text: str) -> Any:
        return self._post("/step", {"action": {"message": text}})


class HttpToolEnvironment:
    """`--env http://127.0.0.1:PORT`: POST /reset {} and POST /step {"action": {"message":
    text}}, each answering {"observation", "reward", "done"}."""

    def __init__(self, url: str, limits: ToolLimits) -> None:
        self.base = loopback_url(url)
        self.name = redact_string(self.base)
        self.guard = Guard(self.name, limits.timeout_s)
        self.plan = TurnPlan(limits.max_turns, tool_turns=True)

    def episode(self, row: dict[str, Any], rng: Stream) -> OpenEnvEpisode:
        return OpenEnvEpisode(self.guard, HttpEnvironmentClient(self.base, self.guard), row, rng)

    def check_rows(self, rows: list[Any], seed: int) -> None:
        """Nothing: the server reads its rows its own way."""
