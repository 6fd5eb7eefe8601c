"""GRPO environments: built-ins, the observation fault, plugins and each plugin error."""

from __future__ import annotations

import math
import re
import textwrap
import time
from pathlib import Path

import pytest

from twinrun.core.errors import ConfigError, DataError, TwinrunError
from twinrun.core.rng import stream
from twinrun.rl.builtin_envs import (
    ArithmeticEnvironment,
    ClockEnvironment,
    first_integer,
    observation_fault,
)
from twinrun.rl.env_checks import checked_prompt, checked_reward, finite_reward
from twinrun.rl.env_protocol import (
    ONE_TURN,
    Environment,
    EnvironmentPluginError,
    EnvReply,
    Episode,
    SingleTurn,
)
from twinrun.rl.environments import environment_kind, no_arguments, open_environment

ROW = {"prompt": "What is 3 + 4?", "answer": "7"}
STAMP = re.compile(r"^\[time \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\] ")


def rng() -> object:
    return stream(0, "env", 0, 0)


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("7", 1.0),
        ("  7", 1.0),
        ("\n7 is the answer", 1.0),
        ("7.", 1.0),
        ("17", 0.0),
        ("-7", 0.0),
        ("The answer is 7", 0.0),
        ("", 0.0),
        ("seven", 0.0),
        ("8", 0.0),
    ],
)
def test_arithmetic_reward(completion: str, reward: float) -> None:
    env = open_environment("arithmetic", {})
    assert env.reward(ROW, completion) == reward
    assert checked_reward(env, "arithmetic", ROW, completion) == reward


def test_arithmetic_prompt_and_negative_answers() -> None:
    env = ArithmeticEnvironment()
    assert isinstance(env, Environment)
    assert env.prompt(ROW, rng()) == "What is 3 + 4?"
    assert env.reward({"prompt": "x", "answer": "-3"}, " -3") == 1.0
    assert env.reward({"prompt": "x", "answer": 5}, "5") == 1.0
    assert first_integer("  -12abc") == -12 and first_integer("x1") is None


def test_arithmetic_bad_rows() -> None:
    env = ArithmeticEnvironment()
    with pytest.raises(DataError, match="'answer'"):
        env.reward({"prompt": "x"}, "1")
    with pytest.raises(DataError, match="not an integer"):
        env.reward({"prompt": "x", "answer": "seven"}, "7")
    with pytest.raises(DataError, match="'prompt'"):
        env.prompt({"answer": "1"}, rng())


def test_clock_prompts_carry_wall_clock_and_differ() -> None:
    env = open_environment("clock", {})
    assert isinstance(env, ClockEnvironment)
    first = env.prompt(ROW, rng())
    start = time.time_ns()
    while time.time_ns() - start < 2_000:  # let the microsecond clock move on
        pass
    second = env.prompt(ROW, rng())
    assert STAMP.match(first) and first.endswith("What is 3 + 4?")
    assert first != second
    assert env.reward(ROW, "7") == 1.0


def test_observation_fault_prepends_timestamp() -> None:
    faulted = observation_fault("What is 1 + 1?")
    assert STAMP.match(faulted) and faulted.endswith("What is 1 + 1?")


def test_builtins_take_no_args_and_unknown_names() -> None:
    with pytest.raises(ConfigError, match="takes no arguments"):
        open_environment("arithmetic", {"x": 1})
    with pytest.raises(ConfigError, match="unknown environment 'arith'"):
        open_environment("arith", {})
    with pytest.raises(EnvironmentPluginError, match="module.path:factory"):
        open_environment("bad name:f", {})


PLUGIN = """
class Env:
    def __init__(self, target, bonus=0.0):
        self.target = target
        self.bonus = bonus

    def prompt(self, row, rng):
        return f"{row['prompt']} (draw {rng.integers(0, 10)})"

    def reward(self, row, completion):
        return (1.0 if completion.strip() == self.target else 0.0) + self.bonus


def make(target, bonus=0.0):
    return Env(target, bonus)


def raises(**kwargs):
    raise RuntimeError("factory exploded\\nsecond line")


def no_methods(**kwargs):
    return object()


def nan_reward(**kwargs):
    class E:
        def prompt(self, row, rng):
            return row["prompt"]

        def reward(self, row, completion):
            if completion == "boom":
                return 1 / 0
            return {"nan": float("nan"), "inf": float("inf"), "str": "1.0",
                    "bool": True, "int": 1}[completion]
    return E()


def echoes(api_key, label="x"):
    raise ValueError(f"bad key {api_key!r} for {label}")


from os import getcwd as imported_elsewhere  # a callable the module did not define
from functools import partial
partial_factory = partial(make, "42")
NOT_CALLABLE = 3
"""


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pkg = tmp_path / "twinrun_test_plugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text(textwrap.dedent(PLUGIN))
    (pkg / "broken.py").write_text("import definitely_not_a_module_xyz\n")
    (pkg / "loud").mkdir()  # a package whose __init__ leaves a mark when it runs
    (pkg / "loud" / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (pkg / "loud" / "envs.py").write_text("")
    (pkg / "reexport.py").write_text("from os import system\nfrom subprocess import Popen\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "twinrun_test_plugins"


def test_plugin_end_to_end(plugin_module: str) -> None:
    name = f"{plugin_module}.envs:make"
    env = open_environment(name, {"target": "42", "bonus": 0.5})
    row = {"prompt": "Say 42."}
    p1 = checked_prompt(env, name, row, stream(3, "env", 1, 0))
    p2 = checked_prompt(env, name, row, stream(3, "env", 1, 0))
    assert p1 == p2 and p1.startswith("Say 42. (draw ")
    assert checked_reward(env, name, row, " 42 ") == 1.5
    assert checked_reward(env, name, row, "41") == 0.5


@pytest.mark.parametrize(
    ("target", "args", "pattern"),
    [
        ("envs_missing:make", {}, "cannot find module"),
        ("broken:make", {}, "cannot import module .*ModuleNotFoundError"),
        ("envs:nope", {}, "has no attribute 'nope'"),
        ("envs:NOT_CALLABLE", {}, "not callable"),
        ("envs:raises", {}, "factory raised RuntimeError: factory exploded second line"),
        ("envs:make", {}, "factory raised TypeError"),  # missing required `target`
        ("envs:no_methods", {}, "object .object. has none of the shapes: prompt.row, rng."),
        ("envs:imported_elsewhere", {}, "not a Python function or class"),
        ("envs:partial_factory", {}, "is a partial, not a Python function or class"),
        ("envs:Env.prompt", {}, "module.path:factory"),
    ],
)
def test_plugin_errors(plugin_module: str, target: str, args: dict, pattern: str) -> None:
    name = f"{plugin_module}.{target}"
    with pytest.raises(EnvironmentPluginError, match=pattern) as info:
        open_environment(name, args)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, TwinrunError)
    assert name in err.message and "\n" not in err.one_line()


def test_plugin_args_not_echoed(plugin_module: str) -> None:
    with pytest.raises(EnvironmentPluginError) as info:
        open_environment(f"{plugin_module}.envs:raises", {"api_key": "sk-SECRET"})
    assert "sk-SECRET" not in info.value.one_line()


def test_plugin_error_line_hides_argument_values(plugin_module: str) -> None:
    """A factory whose exception repeats an argument's value: the line keeps the key names'
    places but not the value (nor a URL's credentials)."""
    name = f"{plugin_module}.envs:echoes"
    args = {"api_key": "sk-SECRET-123", "label": "https://u:PW@h/m"}
    with pytest.raises(EnvironmentPluginError, match="factory raised ValueError") as info:
        open_environment(name, args)
    line = info.value.one_line()
    assert "sk-SECRET-123" not in line and "PW" not in line and "<redacted>" in line


@pytest.mark.parametrize(
    "target",
    ["os:system", "subprocess:getoutput", "os.path:join", "builtins:exec", "sys:exit"],
)
def test_standard_library_is_refused_before_import(target: str) -> None:
    with pytest.raises(EnvironmentPluginError, match="standard library") as info:
        open_environment(target, {"command": "touch F"})
    assert "touch F" not in info.value.one_line()


def test_a_callable_imported_into_the_module_is_refused(plugin_module: str) -> None:
    for factory, pattern in (("system", "not a Python function"), ("Popen", "is defined in")):
        with pytest.raises(EnvironmentPluginError, match=pattern):
            open_environment(f"{plugin_module}.reexport:{factory}", {"args": "touch F"})
    assert not (Path.cwd() / "F").exists()


def test_plugin_spec_locates_without_importing(plugin_module: str, tmp_path: Path) -> None:
    """explain's check: the module is found, its package's __init__ never runs."""
    from twinrun.rl.plugin_trust import check_plugin_name, plugin_spec

    assert plugin_spec(f"{plugin_module}.loud.envs") is not None
    assert check_plugin_name(f"{plugin_module}.loud.envs:make", {}) == (
        f"{plugin_module}.loud.envs",
        "make",
    )
    assert plugin_spec(f"{plugin_module}.loud.missing") is None
    assert plugin_spec(f"{plugin_module}.envs.sub") is None  # a module has no submodules
    with pytest.raises(EnvironmentPluginError, match="cannot find module"):
        check_plugin_name(f"{plugin_module}.nowhere:make", {})
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("completion", "pattern"),
    [
        ("nan", "returned nan, not a finite float"),
        ("inf", "returned inf, not a finite float"),
        ("str", "returned str '1.0', not a float"),
        ("bool", "returned bool"),
        ("boom", "reward raised ZeroDivisionError"),
    ],
)
def test_checked_reward_refuses_non_finite_floats(
    plugin_module: str, completion: str, pattern: str
) -> None:
    name = f"{plugin_module}.envs:nan_reward"
    env = open_environment(name, {})
    with pytest.raises(EnvironmentPluginError, match=pattern) as info:
        checked_reward(env, name, {"prompt": "p"}, completion)
    assert name in info.value.message
    assert checked_reward(env, name, {"prompt": "p"}, "int") == 1.0


def test_checked_prompt_refuses_non_str() -> None:
    class Bad:
        def prompt(self, row: dict, rng: object) -> object:
            return 7

        def reward(self, row: dict, completion: str) -> float:
            return 0.0

    with pytest.raises(EnvironmentPluginError, match="prompt returned int"):
        checked_prompt(Bad(), "bad:env", {}, stream(0, "env"))  # type: ignore[arg-type]


# --- one protocol: a single-turn environment is episodes of one turn -------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("arithmetic", "builtin"), ("clock", "builtin"), ("calculator", "tool"),
        ("lookup", "tool"), ("http://127.0.0.1:8000", "url"), ("file:///etc/passwd", "url"),
        ("reasoning_gym://x", "url"), ("math-verify", "reward-source"),
        ("reasoning_gym:leg_counting", "reward-source"), ("mypkg.envs:make", "plugin"),
        ("bad name:f", "plugin"), ("arith", "unknown"), ("", "unknown"),
    ],
)  # fmt: skip
def test_environment_kind_reads_the_name_alone(name: str, kind: str) -> None:
    assert environment_kind(name) == kind


def test_no_arguments_for_every_kind_that_takes_none() -> None:
    for name in ("arithmetic", "calculator", "http://127.0.0.1:1", "math-verify"):
        with pytest.raises(ConfigError, match=f"{re.escape(repr(name))} takes no arguments"):
            no_arguments(name, environment_kind(name), {"x": 1})
        no_arguments(name, environment_kind(name), {})
    for name in ("mypkg.envs:make", "reasoning_gym:leg_counting", "unknown"):
        no_arguments(name, environment_kind(name), {"x": 1})
    with pytest.raises(ConfigError, match="'math-verify' takes no arguments, got \\['x'\\]"):
        open_environment("math-verify", {"x": 1})


def test_a_builtin_is_one_turn_episodes() -> None:
    env = open_environment("arithmetic", {})
    assert isinstance(env, Environment) and isinstance(env, SingleTurn) and env.plan == ONE_TURN
    ep = env.episode(dict(ROW), rng())
    assert isinstance(ep, Episode) and ep.tools == ()
    assert ep.start() == "What is 3 + 4?"
    assert ep.answer(" 7") == EnvReply((), True) and ep.reward() == 1.0
    assert ep.answer("8") == EnvReply((), True) and ep.reward() == 0.0  # the next sample
    ep.close()
    with pytest.raises(DataError, match="'arithmetic': 'answer' 'seven' is not an integer"):
        episode = env.episode({"prompt": "x", "answer": "seven"}, rng())
        episode.answer("7")
        episode.reward()


def test_a_plugins_episode_is_a_fresh_instance_and_keeps_its_errors(plugin_module: str) -> None:
    name = f"{plugin_module}.envs:make"
    env = open_environment(name, {"target": "42", "bonus": 0.5})
    first, second = (
        env.episode({"prompt": "Say 42."}, stream(3, "env", 1, 0)),
        env.episode({"prompt": "Say 42."}, stream(3, "env", 1, 0)),
    )
    assert (
        first.start()
        == second.start()
        == checked_prompt(env, name, {"prompt": "Say 42."}, stream(3, "env", 1, 0))
    )
    assert first.env is not second.env is not env  # type: ignore[attr-defined]
    first.answer(" 42 ")
    assert first.reward() == 1.5
    bad = open_environment(f"{plugin_module}.envs:nan_reward", {}).episode({"prompt": "p"}, rng())
    bad.answer("inf")
    with pytest.raises(EnvironmentPluginError, match="reward returned inf, not a finite float"):
        bad.reward()


def test_finite_reward_is_the_one_check() -> None:
    assert finite_reward(3, "x") == 3.0 and type(finite_reward(3, "x")) is float
    for value, shown in ((True, "bool"), ("1", "str"), (None, "NoneType")):
        with pytest.raises(EnvironmentPluginError, match=f"^lead {shown}, not a float$"):
            finite_reward(value, "lead")
    with pytest.raises(EnvironmentPluginError, match="^lead str 'sk-<redacted>', not a float$"):
        finite_reward("sk-secret", "lead", hide=("secret",))
    for value, shown in ((float("nan"), "nan"), (10**400, "int inf"), (-math.inf, "-inf")):
        with pytest.raises(ConfigError, match=f"^lead {shown}, not a finite float$"):
            finite_reward(value, "lead", ConfigError)  # type: ignore[arg-type]
