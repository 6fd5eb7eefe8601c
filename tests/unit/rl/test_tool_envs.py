"""Tool environments: the built-ins, each plugin shape, the loopback HTTP server, the time limit,
the model's faults as failed calls, the environment's faults as one line, and the reward sources
of optional packages."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.errors import ConfigError, DataError
from twinrun.core.rng import stream
from twinrun.rl.env_checks import checked_prompt, checked_reward
from twinrun.rl.env_protocol import (
    ONE_TURN,
    CallRecord,
    Environment,
    EnvironmentPluginError,
    EnvReply,
    Episode,
    TurnPlan,
)
from twinrun.rl.environments import environment_kind, open_environment
from twinrun.rl.tool_base import ToolEnvironmentError
from twinrun.rl.tool_envs import evaluate

ROW = {"prompt": "What is 6 * 7?", "answer": "42"}
STAMP = re.compile(r"^\[time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\] ")


def rng() -> Any:
    return stream(0, "rollout", 0, 0)


def call(name: str, arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def episode(name: str, row: dict[str, Any] = ROW, args: dict | None = None, timeout: float = 5.0):
    env = open_environment(name, args, max_turns=3, timeout_s=timeout)
    assert isinstance(env, Environment) and env.plan == TurnPlan(max_turns=3, tool_turns=True)
    ep = env.episode(dict(row), rng())
    assert isinstance(ep, Episode)
    return ep


# --- calculator and lookup ---------------------------------------------------------------


def test_calculator_episode() -> None:
    ep = episode("calculator")
    assert ep.start() == (
        "What is 6 * 7?\nYou can call the tool calculate (it evaluates arithmetic). When you know "
        "the answer, reply with it as a number at the start of your message."
    )
    assert [t["function"]["name"] for t in ep.tools] == ["calculate"]
    assert ep.tools[0]["function"]["parameters"]["required"] == ["expression"]
    reply = ep.answer("Let me see. " + call("calculate", {"expression": "6 * 7"}))
    assert reply == EnvReply(
        ({"role": "tool", "content": "42"},),
        False,
        (CallRecord("calculate", {"expression": "6 * 7"}, True, "42"),),
    )
    assert ep.answer("I am not sure.") == EnvReply(
        ({"role": "user", "content": "Reply with the answer as a number, or call calculate."},),
        False,
    )
    assert ep.answer(" 42, I think") == EnvReply((), True)
    assert ep.reward() == 1.0
    ep.close()
    wrong = episode("calculator")
    wrong.answer("41")
    assert wrong.reward() == 0.0


@pytest.mark.parametrize(
    ("expression", "value"),
    [("2 + 3 * 4", 14), ("7 / 2", 3.5), ("(1 + 2) ** 3", 27), ("-7 // 2", -4), ("7 % 3", 1),
     ("2.5 * 2", 5.0), ("+4", 4)],
)  # fmt: skip
def test_calculate_values(expression: str, value: float) -> None:
    assert evaluate(expression) == value and type(evaluate(expression)) is type(value)


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ({"expression": "1 / 0"}, "error: ZeroDivisionError: division by zero"),
        ({"expression": "2 ** 65"}, "error: ValueError: exponents above 64 are refused"),
        ({"expression": "__import__('os')"}, "error: ValueError: only numbers, + - * / // % **"),
        ({"expression": "x + 1"}, "error: ValueError: only numbers, + - * / // % **"),
        ({"expression": "1 +"}, "error: ValueError: the expression is not valid arithmetic"),
        ({"expression": "9" * 201}, "error: ValueError: the expression is longer than 200"),
        ({"expression": "(10 ** 60) * (10 ** 60)"}, "error: ValueError: the result is too large"),
        ({"expression": "(-8) ** 0.5"}, "error: ValueError: the result is not a real number"),
        ({"expression": 5}, "error: tool 'calculate': argument 'expression' must be a JSON string"),
        ({}, "error: tool 'calculate': missing required argument(s) 'expression'"),
        ({"expression": "1", "x": 2}, "error: tool 'calculate': got an unexpected keyword"),
    ],
)
def test_calculator_failures_are_failed_calls_and_the_episode_goes_on(
    arguments: dict, result: str
) -> None:
    ep = episode("calculator")
    reply = ep.answer(call("calculate", arguments))
    (record,) = reply.calls
    assert not reply.done and not record.ok and record.result.startswith(result)
    assert reply.messages == ({"role": "tool", "content": record.result},)
    assert ep.answer(call("calculate", {"expression": "1 + 1"})).calls[0].result == "2"


def test_the_models_faults_are_failed_calls() -> None:
    ep = episode("calculator")
    reply = ep.answer(
        call("calc", {"expression": "1"})
        + '<tool_call>{"name": "calculate", "arguments": {"expression": }</tool_call>'
        + "<tool_call>never closed"
    )
    assert [(r.name, r.ok) for r in reply.calls] == [("calc", False), ("", False), ("", False)]
    assert reply.calls[0].result == "error: unknown tool 'calc'; the tools are: calculate"
    assert reply.calls[1].result.startswith("error: tool call: not valid JSON")
    assert reply.calls[1].arguments == '{"name": "calculate", "arguments": {"expression": }'
    assert reply.calls[2].result == "error: <tool_call> is never closed by </tool_call>"
    assert len(reply.messages) == 3 and not reply.done


def test_lookup_replies_carry_the_wall_clock() -> None:
    ep = episode("lookup", {"prompt": "Neon's atomic number plus 2?", "answer": "12"})
    assert [t["function"]["name"] for t in ep.tools] == ["lookup"]
    first = ep.answer(call("lookup", {"key": "Neon"}))
    start = time.time_ns()
    while time.time_ns() - start < 2_000:  # let the microsecond clock move on
        pass
    second = ep.answer(call("lookup", {"key": "neon"}))
    a, b = first.messages[0]["content"], second.messages[0]["content"]
    assert STAMP.match(a) and STAMP.match(b) and a != b
    assert a.endswith("] 10") and b.endswith("] 10") and first.calls[0].result == a
    missing = ep.answer(call("lookup", {"key": "unobtainium"})).calls[0]
    assert STAMP.match(missing.result) and "no entry for 'unobtainium'" in missing.result
    nudge = ep.answer("hmm").messages[0]["content"]
    assert STAMP.match(nudge) and nudge.endswith(
        "Reply with the answer as a number, or call lookup."
    )
    assert ep.answer("12").done and ep.reward() == 1.0


def test_builtins_take_no_arguments_and_single_turn_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="takes no arguments"):
        open_environment("calculator", {"x": 1}, max_turns=2, timeout_s=1.0)
    with pytest.raises(ConfigError, match="--tool-timeout apply to tool .* 'arithmetic' is single"):
        open_environment("arithmetic", None, timeout_s=1.0)
    with pytest.raises(ConfigError, match="unknown environment 'calc'"):
        open_environment("calc", None, max_turns=2, timeout_s=1.0)
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ConfigError, match="--tool-timeout must be a number of seconds in"):
            open_environment("calculator", None, max_turns=2, timeout_s=bad)
    for turns in (0, True, 1.5):
        with pytest.raises(ConfigError, match="--max-turns must be an integer >= 1"):
            open_environment("calculator", None, max_turns=turns, timeout_s=1.0)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="'calculator': examples row has no string 'prompt'"):
        episode("calculator", {"answer": "1"}).start()
    with pytest.raises(DataError, match="'lookup': examples row has no 'answer' field"):
        episode("lookup", {"prompt": "p"}).reward()
    with pytest.raises(DataError, match="'calculator': 'answer' 'x' is not an integer"):
        episode("calculator", {"prompt": "p", "answer": "x"}).reward()


# --- plugins -----------------------------------------------------------------------------

SLOW_S = 600  # the slow tool's and the slow reset's sleep: far past any timeout tested

PLUGIN = (
    f"SLOW_S = {SLOW_S}\n"
    + '''
import dataclasses
import time


class Counter:
    """TRL shape: the public methods are the tools."""

    def __init__(self, by=1):
        self.count = 0
        self.by = by

    def reset(self, prompt, **kwargs):
        return f"Count for: {prompt} ({sorted(kwargs)})"

    def increment(self) -> int:
        """Add to the counter."""
        self.count += self.by
        return self.count

    def add(self, a: int, b: int = 0) -> int:
        """Add two numbers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    def shape(self, kind: str):
        return {"dict": {"b": 1, "a": [True, None]}, "none": None, "float": 0.5,
                "bool": True, "object": object()}[kind]

    def fail(self, why: str) -> str:
        raise RuntimeError(f"tool failed: {why}\\nsecond line")

    def slow(self) -> str:
        time.sleep(SLOW_S)
        return "late"

    def reward(self):
        return float(self.count)

    def _private(self):
        return "not a tool"


class NoReward:
    def reset(self):
        return None

    def noop(self) -> str:
        return "ok"


class AttributeReward(NoReward):
    reward = 0.25


class SeesTheCompletion(NoReward):
    def reward(self, completion):
        return 1.0 if "</tool_call>" in completion else float(len(completion))


class WantsMore(NoReward):
    def reward(self, completion, answer):
        return 0.0


class Secretive:
    def __init__(self, api_key):
        self.api_key = api_key

    def reset(self):
        raise ValueError(f"key {self.api_key} refused")

    def use(self) -> str:
        raise PermissionError(f"no access with {self.api_key}")


class SlowReset:
    def reset(self):
        time.sleep(SLOW_S)


def broken_factory(api_key):
    raise RuntimeError(f"cannot log in with {api_key}")


@dataclasses.dataclass
class Obs:
    text: str


@dataclasses.dataclass
class StepResult:
    observation: object
    reward: float | None
    done: bool


class Guess:
    """OpenEnv shape: guess the target; -0.25 per wrong guess, 1.0 for the right one."""

    def __init__(self, target=7):
        self.target = target

    def reset(self):
        return {"observation": {"text": "Guess a number from 1 to 9."}, "reward": None,
                "done": False}

    def step(self, action):
        guess = action.strip()
        if guess == str(self.target):
            return StepResult(Obs("right"), 1.0, True)
        return {"observation": {"hint": "higher" if guess < str(self.target) else "lower"},
                "reward": -0.25, "done": False}


def make_guess(target=7):
    return Guess(target)


class BadStep(Guess):
    def step(self, action):
        return {"observation": "x", "reward": "1.0", "done": False}


@dataclasses.dataclass
class Tool:
    name: str
    description: str
    input_schema: dict


class McpTools:
    """MCP shape."""

    reward = 0.5

    def list_tools(self):
        return [
            {"name": "echo", "description": "Echo text.",
             "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]}},
            Tool("shout", "Shout text.", {"type": "object", "properties": {}}),
            Tool("bad", "Always fails.", {"type": "object", "properties": {}}),
        ]

    def call_tool(self, name, arguments):
        if name == "echo":
            return {"content": [{"type": "text", "text": arguments["text"]}], "isError": False}
        if name == "shout":
            return arguments["text"].upper()
        return {"content": [{"type": "text", "text": "it failed"}], "isError": True}


class SingleTurn:
    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        return 0.0


class Shapeless:
    def tool(self) -> str:
        return "x"


class Seeded:
    def reset(self, answer, rng):
        return f"draw {rng.integers(0, 1000)}, answer {answer}"


class PositionalOnly:
    def reset(self):
        return None

    def positional(self, x, /) -> str:
        return x
'''
)


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "twinrun_tool_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "twinrun_tool_plugins.envs"


def test_trl_class_shape(plugins: str) -> None:
    ep = episode(f"{plugins}:Counter", args={"by": 2})
    assert ep.start() == "Count for: What is 6 * 7? (['answer'])"  # reset(**row)
    names = [t["function"]["name"] for t in ep.tools]
    assert names == ["add", "fail", "increment", "shape", "slow"]  # not reset, reward, _private
    assert ep.tools[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "The first."},
            "b": {"type": "integer", "description": "The second."},
        },
        "required": ["a"],
    }
    reply = ep.answer(call("increment", {}) + call("add", {"a": 2, "b": 3}))
    assert reply.messages == ({"role": "tool", "content": "2"}, {"role": "tool", "content": "5"})
    assert [r.ok for r in reply.calls] == [True, True] and not reply.done
    assert ep.answer("The count is 2.") == EnvReply((), True)  # no tool call: done
    assert ep.reward() == 2.0
    ep.close()


def test_one_instance_per_rollout(plugins: str) -> None:
    env = open_environment(f"{plugins}:Counter", None, max_turns=2, timeout_s=5.0)
    seen = []
    for _ in range(3):
        ep = env.episode(dict(ROW), rng())
        ep.start()
        replies = [ep.answer(call("increment", {})).messages[0]["content"] for _ in range(2)]
        seen.append((replies, ep.reward()))
    assert seen == [(["1", "2"], 2.0)] * 3


@pytest.mark.parametrize(
    ("kind", "text"),
    [("dict", '{"a":[true,null],"b":1}'), ("none", ""), ("float", "0.5"), ("bool", "True")],
)
def test_tool_returns_become_text(plugins: str, kind: str, text: str) -> None:
    ep = episode(f"{plugins}:Counter")
    assert ep.answer(call("shape", {"kind": kind})).calls[0] == CallRecord(
        "shape", {"kind": kind}, True, text
    )


def test_a_return_that_is_not_text_is_an_error(plugins: str) -> None:
    ep = episode(f"{plugins}:Counter")
    with pytest.raises(ToolEnvironmentError) as info:
        ep.answer(call("shape", {"kind": "object"}))
    assert info.value.one_line().startswith(
        f"environment '{plugins}:Counter': tool 'shape' returned object, not text"
    )


def test_a_raising_tool_is_a_failed_call_and_the_episode_goes_on(plugins: str) -> None:
    ep = episode(f"{plugins}:Counter")
    reply = ep.answer(call("fail", {"why": "bad input"}) + call("increment", {}))
    assert reply.calls[0] == CallRecord(
        "fail",
        {"why": "bad input"},
        False,
        "error: RuntimeError: tool failed: bad input second line",
    )
    assert reply.calls[1].result == "1" and not reply.done
    wrong = ep.answer(call("add", {"a": "one"}) + call("add", {"b": 1}) + call("nope", {}))
    assert [r.result for r in wrong.calls] == [
        "error: tool 'add': argument 'a' must be a JSON integer, got str",
        "error: tool 'add': missing required argument(s) 'a'",
        "error: unknown tool 'nope'; the tools are: add, fail, increment, shape, slow",
    ]


def test_a_tool_past_the_timeout_is_an_error_naming_it(plugins: str) -> None:
    """The slow tool and reset take SLOW_S (600 s, on a daemon thread left behind); the call
    ends at the 0.2 s timeout, so far below SLOW_S that no load makes the bound fail."""
    ep = episode(f"{plugins}:Counter", timeout=0.2)
    began = time.monotonic()
    with pytest.raises(ToolEnvironmentError) as info:
        ep.answer(call("slow", {}))
    assert time.monotonic() - began < SLOW_S / 2  # it did not wait for the tool
    assert info.value.message == (
        f"environment '{plugins}:Counter': tool 'slow' did not return within 0.2 s"
    )
    with pytest.raises(ToolEnvironmentError, match="reset did not return within 0.2 s"):
        episode(f"{plugins}:SlowReset", timeout=0.2).start()


def test_reset_takes_the_fields_it_names_and_the_rollouts_stream(plugins: str) -> None:
    env = open_environment(f"{plugins}:Seeded", None, max_turns=2, timeout_s=5.0)
    first = env.episode(dict(ROW), stream(4, "rollout", 1, 0)).start()
    assert first == env.episode(dict(ROW), stream(4, "rollout", 1, 0)).start()
    assert re.fullmatch(r"draw \d+, answer 42", first)
    assert first != env.episode(dict(ROW), stream(4, "rollout", 2, 0)).start()
    with pytest.raises(ToolEnvironmentError, match="parameter 'x' is positional-only"):
        env = open_environment(f"{plugins}:PositionalOnly", None, max_turns=2, timeout_s=5.0)
        env.episode(dict(ROW), rng())


def test_rewards_of_the_trl_shape(plugins: str) -> None:
    ep = episode(f"{plugins}:AttributeReward")
    assert ep.start() == "What is 6 * 7?"  # reset returned None: the row's prompt
    assert ep.reward() == 0.25
    plain = episode(f"{plugins}:NoReward")
    plain.answer("42")
    assert plain.reward() == 1.0  # no reward: the arithmetic rule on the final turn
    sees = episode(f"{plugins}:SeesTheCompletion")
    sees.answer("I think 41")
    assert sees.reward() == float(len("I think 41"))  # reward(completion): the final turn
    more = episode(f"{plugins}:WantsMore")
    more.answer("42")
    with pytest.raises(ToolEnvironmentError) as info:
        more.reward()
    assert info.value.one_line().startswith(
        f"environment '{plugins}:WantsMore': reward() requires arguments ['completion', 'answer']"
        " — define reward(self) or reward(self, completion)"
    )


def test_the_environments_faults_are_one_line_without_secrets(plugins: str) -> None:
    secret = {"api_key": "sk-SECRET-999"}
    ep = episode(f"{plugins}:Secretive", args=secret)
    with pytest.raises(ToolEnvironmentError) as info:
        ep.start()
    line = info.value.one_line()
    assert line == (
        f"environment '{plugins}:Secretive': reset raised ValueError: key <redacted> refused"
    )
    record = ep.answer(call("use", {})).calls[0]
    assert record.result == "error: PermissionError: no access with <redacted>"
    with pytest.raises(ToolEnvironmentError) as info:
        open_environment(f"{plugins}:broken_factory", secret, max_turns=2, timeout_s=5.0)
    assert "sk-SECRET-999" not in info.value.one_line()
    assert "factory raised RuntimeError: cannot log in with <redacted>" in info.value.one_line()


def test_openenv_shape(plugins: str) -> None:
    for name in (f"{plugins}:Guess", f"{plugins}:make_guess"):
        ep = episode(name)
        assert ep.tools == () and ep.start() == "Guess a number from 1 to 9."
        assert ep.answer("3") == EnvReply(
            ({"role": "user", "content": '{"hint":"higher"}'},), False
        )
        assert ep.answer("9").messages[0]["content"] == '{"hint":"lower"}'
        assert ep.answer(" 7 ") == EnvReply((), True)
        assert ep.reward() == 0.5  # the sum of the step rewards: -0.25 - 0.25 + 1.0
    with pytest.raises(ToolEnvironmentError, match="step's reward is str, not a float"):
        episode(f"{plugins}:BadStep").answer("1")


def test_mcp_shape(plugins: str) -> None:
    ep = episode(f"{plugins}:McpTools")
    assert ep.start() == "What is 6 * 7?"  # no reset: the row's prompt
    assert ep.tools[0] == {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo text.",
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }
    reply = ep.answer(
        call("echo", {"text": "hi"}) + call("shout", {"text": "hi"}) + call("bad", {})
        + call("echo", {})
    )  # fmt: skip
    assert [(r.ok, r.result) for r in reply.calls] == [
        (True, "hi"),
        (True, "HI"),
        (False, "error: it failed"),
        (False, "error: tool 'echo': missing required argument(s) 'text'"),
    ]
    assert ep.answer("done").done and ep.reward() == 0.5


def test_shapes_that_are_not_tool_environments(plugins: str) -> None:
    with pytest.raises(ConfigError, match="--max-turns and --tool-timeout apply to tool envi"):
        open_environment(f"{plugins}:SingleTurn", None, max_turns=2, timeout_s=5.0)
    with pytest.raises(EnvironmentPluginError, match="class Shapeless has none of the shapes"):
        open_environment(f"{plugins}:Shapeless", None, max_turns=2, timeout_s=5.0)
    with pytest.raises(EnvironmentPluginError, match="standard library"):
        open_environment("os:system", {"command": "touch F"}, max_turns=2, timeout_s=5.0)


def test_the_plan_says_whether_tool_turns_happen(
    plugins: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One factory classifies every kind once: the built-ins and URLs by name (no request is
    sent), a plugin by its shape (a class's read, a function factory called once); a reward
    source is told by its name without importing its package."""
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # would fail if it were imported
    assert environment_kind("reasoning_gym:leg_counting") == "reward-source"
    tools = TurnPlan(max_turns=4, tool_turns=True)
    for name in ("calculator", "lookup", "http://127.0.0.1:8000", f"{plugins}:Counter",
                 f"{plugins}:make_guess", f"{plugins}:McpTools"):  # fmt: skip
        assert open_environment(name, max_turns=4, timeout_s=5.0).plan == tools
    for name in ("arithmetic", "clock", f"{plugins}:SingleTurn"):
        assert open_environment(name).plan == ONE_TURN
    with pytest.raises(ConfigError, match="unknown environment 'nonsense'"):
        open_environment("nonsense")
    assert [list(r) for r in ONE_TURN.episodes(3)] == [[0, 1, 2]] and ONE_TURN.draw_key(0) == ()
    assert [list(r) for r in tools.episodes(3)] == [[0], [1], [2]] and tools.draw_key(2) == (2,)


def test_each_kind_checks_its_rows(plugins: str) -> None:
    """A built-in tool environment needs each row's prompt and integer answer (a DataError
    naming the row); a single-turn one builds each prompt and scores each row; a plugin's tool
    environment reads its rows its own way."""
    good, bad = types.SimpleNamespace(data=ROW), types.SimpleNamespace(data={"prompt": "p"})
    bad.where = "examples.jsonl:2"
    for env in (open_environment("calculator", max_turns=2, timeout_s=5.0),
                open_environment("arithmetic")):  # fmt: skip
        env.check_rows([good], 0)
        with pytest.raises(DataError, match=f"^examples.jsonl:2: environment '{env.name}': exa"):
            env.check_rows([good, bad], 0)
    open_environment(f"{plugins}:Counter", max_turns=2, timeout_s=5.0).check_rows([bad], 0)


@pytest.mark.parametrize(
    ("limits", "missing"),
    [({}, "--max-turns and --tool-timeout"), ({"max_turns": 2}, "--tool-timeout"),
     ({"timeout_s": 5.0}, "--max-turns")],
)  # fmt: skip
def test_a_tool_environment_without_its_limits_is_refused(
    plugins: str, limits: dict[str, Any], missing: str
) -> None:
    """No default stands in for a missing limit: the one check that requires them refuses, for
    a built-in, a URL and a plugin (whose shape is read first)."""
    for name in ("calculator", "http://127.0.0.1:8000", f"{plugins}:Counter",
                 f"{plugins}:make_guess"):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            open_environment(name, **limits)
        assert info.value.message == f"tool environment {name!r} needs {missing}"


# --- OpenEnv over HTTP on loopback --------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append((self.path, body))  # type: ignore[attr-defined]
        if self.path.startswith("/error/"):
            self.send_error(500, "exploded")
            return
        if self.path.startswith("/text/"):
            answer = b"not json"
        elif self.path.endswith("/reset"):
            answer = json.dumps({"observation": {"message": "Say hello."}, "reward": None,
                                 "done": False}).encode()  # fmt: skip
        else:
            said = body["action"]["message"]
            done = "hello" in said
            answer = json.dumps({"observation": {"message": "Again."}, "reward": 1.0 if done
                                 else -0.5, "done": done}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_http_loopback_server(server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    ep = episode(url)
    assert ep.tools == () and ep.start() == "Say hello."
    assert ep.answer("hi") == EnvReply(({"role": "user", "content": "Again."},), False)
    assert ep.answer("hello there") == EnvReply((), True)
    assert ep.reward() == 0.5
    assert server.bodies == [  # type: ignore[attr-defined]
        ("/reset", {}),
        ("/step", {"action": {"message": "hi"}}),
        ("/step", {"action": {"message": "hello there"}}),
    ]
    local = episode(f"http://localhost:{server.server_address[1]}/")
    assert local.start() == "Say hello."


def test_http_faults_are_one_line(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    with pytest.raises(ToolEnvironmentError, match=r"POST /reset answered HTTP 500 exploded$"):
        episode(f"http://127.0.0.1:{port}/error").start()
    with pytest.raises(ToolEnvironmentError, match=r"POST /reset answer: not valid JSON"):
        episode(f"http://127.0.0.1:{port}/text").start()
    server.shutdown()
    server.server_close()
    with pytest.raises(ToolEnvironmentError, match=r"POST /reset failed: ConnectionRefusedError"):
        episode(f"http://127.0.0.1:{port}").start()


@pytest.mark.parametrize(
    "url",
    ["http://example.com:8000", "http://10.0.0.1:80", "http://127.0.0.1.example.com/",
     "ftp://127.0.0.1:21", "http://user:SECRET-PW@example.com:1"],
)  # fmt: skip
def test_only_the_loopback_interface(url: str) -> None:
    with pytest.raises(ToolEnvironmentError) as info:
        open_environment(url, max_turns=1, timeout_s=1.0)
    line = info.value.one_line()
    assert "only the loopback interface can serve an environment" in line
    assert "SECRET-PW" not in line and "\n" not in line


# --- reward sources of optional packages ---------------------------------------------------


def test_missing_packages_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ConfigError) as info:
        open_environment("reasoning_gym:leg_counting", {})
    assert info.value.message == (
        "environment 'reasoning_gym:leg_counting' needs the reasoning-gym package: "
        "pip install reasoning-gym"
    )
    with pytest.raises(ConfigError, match="'math-verify' needs the math-verify package: pip"):
        open_environment("math-verify", {})
    with pytest.raises(ConfigError, match="is not a reasoning-gym task name"):
        open_environment("reasoning_gym:no such", {})


def test_reasoning_gym_task_scores_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, dict]] = []

    class Dataset:
        def score_answer(self, answer: str | None, entry: dict) -> float:
            return 1.0 if answer == entry["answer"] else 0.01 if entry["metadata"] else 0.0

    def create_dataset(name: str, **config: Any) -> Dataset:
        if name == "missing":
            raise ValueError(f"Dataset {name} not registered")
        made.append((name, config))
        return Dataset()

    fake = types.ModuleType("reasoning_gym")
    fake.create_dataset = create_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "reasoning_gym", fake)
    name = "reasoning_gym:leg_counting"
    env = open_environment(name, {"min_animals": 3})
    assert made == [("leg_counting", {"size": 1, "seed": 0, "min_animals": 3})]
    row = {"question": "How many legs?", "answer": "8", "metadata": {"x": 1}}
    assert checked_prompt(env, name, row, rng()) == "How many legs?"
    assert checked_reward(env, name, row, "8") == 1.0
    assert checked_reward(env, name, row, "9") == 0.01
    assert checked_reward(env, name, {"prompt": "p", "answer": "8"}, "9") == 0.0
    with pytest.raises(ConfigError, match="create_dataset raised ValueError: Dataset missing"):
        open_environment("reasoning_gym:missing", {})


def test_math_verify_scores_completions(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("math_verify")
    fake.parse = lambda text: [text.strip().strip("$").replace(" ", "")]  # type: ignore[attr-defined]
    fake.verify = lambda gold, answer: gold == answer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "math_verify", fake)
    env = open_environment("math-verify", {})
    row = {"prompt": "Half of 1?", "answer": "$\\frac{1}{2}$"}
    assert checked_prompt(env, "math-verify", row, rng()) == "Half of 1?"
    assert checked_reward(env, "math-verify", row, " \\frac{1}{2} ") == 1.0
    assert checked_reward(env, "math-verify", row, "0.3") == 0.0


def test_no_optional_package_nor_torch_is_imported() -> None:
    import subprocess

    code = (
        "import sys, twinrun.rl.tool_envs, twinrun.rl.tool_calls, twinrun.rl.environments\n"
        "heavy = {'torch', 'trl', 'openenv', 'mcp', 'reasoning_gym', 'math_verify', 'requests'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    src = str(Path(__file__).resolve().parents[3] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": src}, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[]"
