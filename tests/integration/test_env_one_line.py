"""Issue 35, item 6: every failure of an environment's code or of a tool setting is one line
naming what failed (the tool, the environment, the option), never a Python internal error:
lone surrogates, a reward past a float, values nested 100,000 deep or circular, a plugin's own
KeyboardInterrupt, a 100 MB reply, `--tool-timeout 1e308`, URLs two parsers read differently."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from twinrun.core.errors import ConfigError, TwinrunError
from twinrun.rl.env_checks import checked_reward
from twinrun.rl.env_protocol import EnvironmentPluginError
from twinrun.rl.environments import open_environment
from twinrun.rl.tool_base import (
    MAX_NESTING,
    MAX_REPLY_CHARS,
    Guard,
    ToolEnvironmentError,
    bounded,
    nesting_problem,
)
from twinrun.rl.tool_plugins import loopback_url
from twinrun.rl.tool_settings import MAX_TIMEOUT_S

GUARD = Guard("mypkg:Env", 5.0)


def deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


def one_line(exc: pytest.ExceptionInfo[TwinrunError]) -> str:
    line = exc.value.one_line()
    assert "\n" not in line
    return line


def test_a_lone_surrogate_in_a_reply_is_one_line_naming_the_tool() -> None:
    with pytest.raises(ToolEnvironmentError) as exc:
        GUARD.text("tool 'look'", "ok \ud800")
    assert "'mypkg:Env'" in one_line(exc) and "tool 'look'" in one_line(exc)
    assert "lone surrogate '\\ud800' at character 3" in one_line(exc)
    with pytest.raises(ToolEnvironmentError, match="not valid Unicode"):
        GUARD.text("reset observation", {"text": ["\udfff"]})


def test_a_reply_over_the_cap_is_blamed_on_the_tool_with_its_size() -> None:
    with pytest.raises(ToolEnvironmentError) as exc:
        GUARD.text("tool 'dump'", "x" * (100 << 20))
    line = one_line(exc)
    assert f"tool 'dump' returned {100 << 20} characters" in line, line
    assert str(MAX_REPLY_CHARS) in line and "template" not in line
    assert GUARD.text("tool 'ok'", "x" * MAX_REPLY_CHARS) == "x" * MAX_REPLY_CHARS


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 50_000, 100_000])
def test_deep_values_are_refused_without_recursion(depth: int) -> None:
    with pytest.raises(ToolEnvironmentError) as exc:
        GUARD.text("tool 'deep'", deep(depth))
    assert f"nested deeper than {MAX_NESTING} levels" in one_line(exc)
    assert GUARD.text("tool 'ok'", deep(MAX_NESTING - 1)).startswith("[[")


def test_circular_values_are_refused() -> None:
    loop: dict = {}
    loop["self"] = loop
    with pytest.raises(ToolEnvironmentError, match="or is circular"):
        GUARD.text("step observation", loop)
    wide: list = []
    wide.extend([wide, wide])  # a doubling cycle is refused too, by depth or by count
    assert nesting_problem(wide) is not None
    assert nesting_problem({"type": "object", "properties": {"a": {"type": "integer"}}}) is None


def test_mcp_schemas_nested_deep_are_refused_in_one_line(tmp_path: Path) -> None:
    from twinrun.rl.tool_plugins import McpEpisode

    class Server:
        def list_tools(self) -> list:
            return [{"name": "t", "inputSchema": {"type": "object", "properties": deep(60_000)}}]

    with pytest.raises(ToolEnvironmentError) as exc:
        McpEpisode(GUARD, Server(), {"prompt": "p"}, None)  # type: ignore[arg-type]
    assert "list_tools" in one_line(exc) and "nested deeper than" in one_line(exc)


def test_a_reward_past_a_float_is_one_line() -> None:
    class Env:
        def reward(self, row: dict, completion: str) -> int:
            return 10**400

    with pytest.raises(EnvironmentPluginError) as exc:
        checked_reward(Env(), "mypkg:big", {}, "")  # type: ignore[arg-type]
    assert "'mypkg:big': reward returned int inf, not a finite float" in one_line(exc)
    with pytest.raises(ToolEnvironmentError, match="reward is int inf, not a finite float"):
        GUARD.reward(-(10**400))
    assert GUARD.reward(10**300) == 1e300


def test_a_plugins_own_keyboard_interrupt_is_its_failure() -> None:
    def plugin() -> None:
        raise KeyboardInterrupt

    with pytest.raises(ToolEnvironmentError) as exc:
        GUARD.call("reset", plugin)
    assert "'mypkg:Env': reset raised RuntimeError: KeyboardInterrupt" in one_line(exc)
    with pytest.raises(RuntimeError):
        bounded(1.0, plugin)


@pytest.mark.parametrize("timeout", [1e308, MAX_TIMEOUT_S + 1, 0, -1.0, float("nan")])
def test_the_timeout_value_is_checked_before_any_factory(timeout: float) -> None:
    with pytest.raises(ConfigError) as exc:
        open_environment("calculator", None, max_turns=1, timeout_s=timeout)
    assert f"--tool-timeout must be a number of seconds in (0, {MAX_TIMEOUT_S}]" in one_line(exc)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1\\@127.0.0.1:8000",
        "http://127.0.0.1:8000\\@10.0.0.1",
        "http://user:pw@127.0.0.1:8000",
        "http://127.0.0.1%2f@10.0.0.1:8000",
        "http://127.0.0.1:8000/?next=http://10.0.0.1",
        "http://127.0.0.1:8000/#frag",
        "http://127.0.0.1:8000/ x",
        "http://[::1%25eth0]:8000",
    ],
)
def test_urls_parsers_could_disagree_on_are_refused(url: str) -> None:
    with pytest.raises(ToolEnvironmentError) as exc:
        loopback_url(url)
    line = one_line(exc)  # a host that is not loopback is refused as such first
    assert "could read it as different hosts" in line or "only the loopback interface" in line


def test_the_client_is_given_the_host_that_was_checked() -> None:
    assert loopback_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert loopback_url("http://LOCALHOST:9/env") == "http://localhost:9/env"
    assert loopback_url("http://[::1]:80") == "http://[::1]:80"


# --- the command line: exit 2 and one stderr line -----------------------------------------

HOSTILE = """
class Interrupts:
    def reset(self, **row):
        raise KeyboardInterrupt

    def look(self, key: str) -> str:
        return key


class Surrogate:
    def reset(self, **row):
        return "what is \\ud800?"

    def look(self, key: str) -> str:
        return key
"""


@pytest.fixture(scope="module")
def hostile_plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile_tool_plugins")
    (d / "twinrun_test_hostile_tool_env.py").write_text(HOSTILE)
    sys.path.insert(0, str(d))
    return d


@pytest.mark.parametrize(
    ("env", "timeout", "message"),
    [
        ("calculator", "1e308", "--tool-timeout must be in (0, 86400], got 1e+308"),
        ("twinrun_test_hostile_tool_env:Interrupts", "10",
         "reset raised RuntimeError: KeyboardInterrupt raised by the environment's code"),
        ("twinrun_test_hostile_tool_env:Surrogate", "10", "not valid Unicode"),
    ],
)  # fmt: skip
def test_the_command_line_says_one_line(
    tmp_path: Path, toy_model_dir: Path, hostile_plugins: Path, env: str, timeout: str,
    message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from tests.integration.test_tool_grpo import tool_args
    from twinrun.cli.main import run_cli

    monkeypatch.delenv("TWINRUN_DEBUG", raising=False)
    examples = tmp_path / "arith.jsonl"
    examples.write_text('{"prompt": "What is 1 + 2?", "answer": "3"}\n' * 4)
    out = tmp_path / "out"
    args = tool_args(toy_model_dir, examples, out, env)
    args[args.index("--tool-timeout") + 1] = timeout
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert "Traceback" not in err[0]
    assert not (out / "adapter_model.safetensors").exists()  # no adapter of a run that failed


def test_a_single_turn_plugins_own_interrupt_is_its_failure_and_a_real_one_stops() -> None:
    import os
    import signal

    from twinrun.rl.env_checks import checked_prompt

    class Own:
        def reward(self, row: dict, completion: str) -> float:
            raise KeyboardInterrupt

        def prompt(self, row: dict, rng: object) -> str:
            raise KeyboardInterrupt

    with pytest.raises(EnvironmentPluginError) as exc:
        checked_reward(Own(), "mypkg:own", {}, "")  # type: ignore[arg-type]
    assert "'mypkg:own': reward raised KeyboardInterrupt itself" in one_line(exc)
    with pytest.raises(EnvironmentPluginError, match="prompt raised KeyboardInterrupt itself"):
        checked_prompt(Own(), "mypkg:own", {}, None)  # type: ignore[arg-type]

    class CtrlC:
        def reward(self, row: dict, completion: str) -> float:
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, during the plugin's call
            return 0.0

    # Python's own Ctrl-C handler, whatever an earlier test in this worker left installed
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            checked_reward(CtrlC(), "mypkg:ctrlc", {}, "")  # type: ignore[arg-type]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_lines_are_in_the_catalogue() -> None:
    catalogue = (Path(__file__).parents[2] / "docs" / "errors.md").read_text(encoding="utf-8")
    for text in ("--tool-timeout must be in (0, 86400], got 1e+308",
                 "returned text that is not valid Unicode (a lone surrogate",
                 "more than the 1048576 one reply may hold",
                 "is nested deeper than 100 levels (or is circular)",
                 "reward returned int inf, not a finite float",
                 "KeyboardInterrupt raised by the environment's code",
                 "raised KeyboardInterrupt itself (no Ctrl-C was given)",
                 "could read it as different hosts"):  # fmt: skip
        assert text in catalogue, text
