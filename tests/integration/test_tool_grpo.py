"""Multi-turn GRPO in tool environments on the toy model: every turn sampled by twinrun, tool
tokens in the rows but out of the loss, observations as diag leaves, capture and replay."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import sha256_of
from twinrun.cli.main import run_cli
from twinrun.objectives.grpo_logprobs import LOGPROB_CHUNK

TRL_STYLE = '''
class Counter:
    """A TRL environment_factory class: public methods are tools; the counter is per instance."""

    def __init__(self):
        self.calls = 0

    def reset(self, **row):
        self.answer = int(row["answer"])
        return row["prompt"] + " Use add(a, b)."

    def add(self, a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: the first
            b: the second
        """
        self.calls += 1
        return str(a + b + self.calls - 1)

    def reward(self):
        return float(self.calls)
'''

OPENENV_STYLE = '''
class Guess:
    """An OpenEnv-style environment: reset() and step(action) -> observation, reward, done."""

    def __init__(self, limit=3):
        self.limit = int(limit)

    def reset(self, **row):
        self.turns = 0
        self.answer = row["answer"]
        return {"observation": row["prompt"], "reward": 0.0, "done": False}

    def step(self, action):
        self.turns += 1
        right = action.strip().startswith(self.answer)
        return {"observation": "again" if not right else "yes",
                "reward": 1.0 if right else -0.25 * self.turns, "done": right}
'''

ECHO = '''
class Echo:
    """OpenEnv-style: each reply quotes the model's turn; the reward is its length mod 3, so the
    episodes' rewards differ and the update has a gradient."""

    def reset(self, **row):
        return {"observation": row["prompt"], "reward": 0.0, "done": False}

    def step(self, action):
        return {"observation": "you said: " + action, "reward": float(len(action) % 3),
                "done": False}
'''


BROKEN = '''
import time


class Raises:
    """reset raises: the environment's own failure."""

    def reset(self, **row):
        raise RuntimeError("database at /srv/secret-path is down")

    def look(self, key: str) -> str:
        return key


class Hangs:
    """reset never returns within the time limit."""

    def reset(self, **row):
        time.sleep(30)

    def look(self, key: str) -> str:
        return key
'''


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("tools") / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 5)
            for b in range(1, 3)]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tool_plugins")
    (d / "twinrun_test_trl_env.py").write_text(TRL_STYLE)
    (d / "twinrun_test_openenv.py").write_text(OPENENV_STYLE)
    (d / "twinrun_test_broken_env.py").write_text(BROKEN)
    (d / "twinrun_test_echo_env.py").write_text(ECHO)
    sys.path.insert(0, str(d))
    return d


def tool_args(model: Path, examples: Path, out: Path, env: str, *extra: str) -> list[str]:
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "3", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
        "--batch-size", "4", "--max-new-tokens", "4", "--temperature", "1.0",
        "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "12",
        "--learning-rate", "5e-2", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "4", "--lora-alpha", "8",
        "--precision", "f32", "--chat-template", "on", "--quiet", "--threads", "1", "--diag",
        "--env", env, "--max-turns", "2", "--tool-timeout", "10", *extra,
    ]  # fmt: skip


def diag_rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "diag.jsonl").read_text().splitlines()]


def test_calculator_runs_multi_turn_and_reproduces(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        args = tool_args(toy_model_dir, arith, out, "calculator")
        args[args.index("--steps") + 1] = "2"
        assert run_cli(args) == 0
    # the untrained model never answers right: every reward is 0, and each run says so once
    err = capsys.readouterr().err
    assert err.count("update is a no-op") == 2 and "NoSignalWarning" in err
    for name in ("adapter_model.safetensors", "diag.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    leaves = list(diag_rows(a)[0]["checksums"])
    # the untrained toy model never answers with a number: the calculator nudges it, so every
    # episode runs to the turn limit, and every turn's observation is a leaf, before the tokens
    observed = [x for x in leaves if x.startswith("observation.")]
    assert observed == [f"observation.prompt_{g}.sample_{k}.turn_{t}" for g in range(2)
                        for k in range(2) for t in range(2)]  # fmt: skip
    assert leaves.index(observed[-1]) < leaves.index("rollout.tokens")
    assert {"rollout.turn_prompt_ids", "rollout.turn_tokens", "rollout.model_mask"} <= set(leaves)


def test_lookup_timestamp_parts_runs_at_the_turn_it_shows(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert run_cli(tool_args(toy_model_dir, arith, out, "lookup")) == 0
    capsys.readouterr()
    assert run_cli(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    first = next(line for line in out.splitlines() if line.startswith("FIRST_DIVERGENCE"))
    # turn 0 is the row's prompt (the same); the nudge at turn 1 carries the wall clock
    assert first.startswith("FIRST_DIVERGENCE: step=0 leaf=observation.prompt_0.sample_0.turn_1 ")
    assert "the observation changed at turn 1 of sample 0 (prompt 0)" in out
    assert "a timestamp, a path or an id?" in out


def test_trl_and_openenv_shapes_train(
    tmp_path: Path, toy_model_dir: Path, arith: Path, plugins: Path
) -> None:
    for env in ("twinrun_test_trl_env:Counter", "twinrun_test_openenv:Guess"):
        out = tmp_path / env.split(":")[1]
        assert run_cli(tool_args(toy_model_dir, arith, out, env)) == 0
        assert (out / "adapter_model.safetensors").is_file()
        again = tmp_path / (out.name + "-again")
        assert run_cli(tool_args(toy_model_dir, arith, again, env)) == 0
        assert sha256_of(out / "adapter_model.safetensors") == sha256_of(
            again / "adapter_model.safetensors"
        )


def test_gradient_checkpointing_and_long_rows_write_the_same_bytes(
    tmp_path: Path, toy_model_dir: Path, arith: Path, plugins: Path
) -> None:
    """Long multi-turn rows — 2 turns of up to 48 tokens and the environment's replies, more
    kept positions than one float64 log-softmax chunk — with rewards that differ: recomputing
    each decoder layer in the backward (`--gradient-checkpointing`, the memory remedy
    docs/tool-environments.md names) writes the adapter and diag bytes of the run without it."""
    runs = {name: tmp_path / name for name in ("plain", "checkpointed")}
    for name, out in runs.items():
        args = tool_args(toy_model_dir, arith, out, "twinrun_test_echo_env:Echo")
        for flag, value in (("--max-new-tokens", "48"), ("--token-cap", "96")):
            args[args.index(flag) + 1] = value
        assert run_cli(args + (["--gradient-checkpointing"] if name == "checkpointed" else [])) == 0
    plain, checkpointed = runs.values()
    (step,) = [json.loads(x) for x in (plain / "metrics.jsonl").read_text().splitlines()]
    assert step["loss"] != 0.0 and step["active_tokens"] > LOGPROB_CHUNK
    for name in ("adapter_model.safetensors", "diag.jsonl"):
        assert (plain / name).read_bytes() == (checkpointed / name).read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--max-turns", "3"), "needs --tool-timeout"),
        (("--tool-timeout", "5"), "needs --max-turns"),
    ],
)
def test_tool_environment_needs_its_limits(
    tmp_path: Path, toy_model_dir: Path, arith: Path, extra: tuple[str, ...], message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    args = tool_args(toy_model_dir, arith, tmp_path / "out", "calculator")
    cut = args.index("--max-turns")
    args = args[:cut] + list(extra)
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_single_turn_environment_refuses_tool_limits(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = tool_args(toy_model_dir, arith, tmp_path / "out", "arithmetic")
    assert run_cli(args) == 2
    assert "apply to tool environments only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_timestamp_step_captured_once_replays_twice_bit_for_bit(
    tmp_path: Path,
    toy_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The situation capture/replay exists for: a tool whose answers carry the wall clock, so no
    two runs agree. The captured step replays twice, with no environment, tool or sampling."""
    from testkit.captures import Capture, arith, grpo_source, init_adapter, run_config
    from twinrun.capture.payload import decode

    init = init_adapter(tmp_path / "init", toy_model_dir)
    doc = grpo_source(toy_model_dir, arith(tmp_path), "lookup", init, tmp_path / "source")
    doc["environment"] |= {"max_turns": 2, "tool_timeout": 10.0}
    doc["grpo"]["group_size"] = 2
    doc["grpo"]["token_cap"] = 12
    assert run_config(tmp_path / "source.toml", doc) == 0
    cap = Capture(doc, tmp_path / "source", 0)
    payload = decode((cap.out / "optimizer_batch_step_000000.safetensors").read_bytes(), "cap")
    mask = payload.arrays.extras["ints.model_mask"][1]
    assert mask.sum() < len(mask) and (payload.arrays.loss_mask <= mask).all()
    assert (mask == 0).any() and payload.arrays.loss_mask.sum() > 0

    def no(*args: object, **kwargs: object) -> None:
        raise AssertionError("a replay built an environment or sampled")

    for target in ("twinrun.train.recipes.grpo.collect_rollouts",
                   "twinrun.train.recipes.grpo.run_environment",
                   "twinrun.train.recipes.grpo.open_environment",
                   "twinrun.data.examples.load_rows"):  # fmt: skip
        monkeypatch.setattr(target, no)
    for name in ("r1", "r2"):
        assert run_config(tmp_path / f"{name}.toml", cap.replay_config(tmp_path / name)) == 0
        assert sha256_of(tmp_path / name / "final" / "adapter_model.safetensors") == sha256_of(
            cap.out / "final" / "adapter_model.safetensors"
        )
    capsys.readouterr()
    rc = run_cli(["evidence", str(cap.out), str(tmp_path / "r1"), str(tmp_path / "r2"),
                  "--require", "B", "--json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["gates"]["B"]["ok"]


def test_check_says_the_timestamp_environment_is_not_deterministic_and_where(
    toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = tool_args(toy_model_dir, arith, Path("{out}"), "lookup")
    args[args.index("--seed") + 1] = "{seed}"
    args[args.index("--prompts-per-step") + 1] = "1"
    rc = run_cli(["check", "--", sys.executable, "-m", "twinrun", *args])
    out = capsys.readouterr().out
    assert rc == 1, out
    first = next(line for line in out.splitlines() if line.startswith("FIRST_DIVERGENCE"))
    assert first.startswith("FIRST_DIVERGENCE: step=0 leaf=observation.prompt_0.sample_0.turn_1 ")
    assert "the environment is not deterministic: the observation changed at turn 1" in out


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("Raises", "reset raised RuntimeError: database at /srv/secret-path is down"),
        ("Hangs", "did not return within 0.5 s"),
    ],
)
def test_an_environment_that_fails_stops_the_run_in_one_line(
    tmp_path: Path, toy_model_dir: Path, arith: Path, plugins: Path, factory: str, message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    args = tool_args(toy_model_dir, arith, out, f"twinrun_test_broken_env:{factory}")
    args[args.index("--tool-timeout") + 1] = "0.5"
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "twinrun_test_broken_env" in err[0], err
    assert not (out / "adapter_model.safetensors").exists()  # no adapter of a run that failed


def test_log_completions_writes_readable_byte_stable_transcripts(
    tmp_path: Path, toy_model_dir: Path, arith: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = {name: tmp_path / name for name in ("plain", "logged", "again")}
    for name, out in runs.items():
        args = tool_args(toy_model_dir, arith, out, "calculator")
        args[args.index("--steps") + 1] = "2"
        if name != "plain":
            args += ["--log-completions", "3"]
        assert run_cli(args) == 0
    capsys.readouterr()
    plain, logged, again = runs.values()
    assert not (plain / "completions.jsonl").exists()
    text = (logged / "completions.jsonl").read_bytes()
    assert text == (again / "completions.jsonl").read_bytes()  # byte-stable
    # writing transcripts changes nothing the run trains
    assert sha256_of(plain / "adapter_model.safetensors") == sha256_of(
        logged / "adapter_model.safetensors"
    )
    lines = [json.loads(x) for x in text.decode().splitlines()]
    assert [(x["step"], x["example"] >= 0, x["k"]) for x in lines] == [
        (s, True, k) for s in range(2) for k in (0, 1, 0)
    ]  # the first 3 rollouts of each step: group 0's two samples, then group 1's first
    for x in lines:
        assert x["prompt"].startswith("<|bos|>") and "+" in x["prompt"]
        assert x["reward"] == 0.0 and x["advantage"] == 0.0
        assert len(x["turns"]) == 2  # the calculator nudges the toy to the turn limit
        assert set(x["turns"][0]) == {"said"}
        assert set(x["turns"][1]) == {"observation", "said"}
        (reply,) = x["turns"][1]["observation"]
        assert reply["role"] and reply["content"]
        assert x["completion"].startswith(x["turns"][0]["said"])
