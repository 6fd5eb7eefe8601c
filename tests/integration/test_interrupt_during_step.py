"""A signal while a step waits on an environment's code that does not return (a tool call that
sleeps, a reward that sleeps), as a real process: the step is abandoned at once and the run
stops in one `interrupted` line — exit 143 for SIGTERM, 130 for Ctrl-C — with no adapter, no
sidecar and no file the run's list of written files does not name.

The bound on the wait is far from the expected time (about a second): it only tells "stopped"
from "still blocked in a 600 s sleep"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLUGIN = """
import os
import time


def _blocked():
    open(os.environ["BLOCK_MARKER"], "w").close()  # the test signals from here on
    time.sleep(600)


class Sleepy:  # multi-turn: step() is called on every turn
    def reset(self, **row):
        return {"observation": row["prompt"], "reward": 0.0, "done": False}

    def step(self, action):
        _blocked()
        return {"observation": "ok", "reward": 1.0, "done": True}


class SleepyReward:  # single-turn: the reward is called on the main thread
    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        if completion:  # not the check of the rows before the steps (completion "")
            _blocked()
        return 1.0


def tool():
    return Sleepy()


def reward():
    return SleepyReward()
"""


def grpo(model: Path, examples: Path, out: Path, env: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "twinrun", "tune", "grpo", "--model", str(model), "--examples",
        str(examples), "--output", str(out), "--seed", "1", "--steps", "2",
        "--prompts-per-step", "2", "--group-size", "2", "--batch-size", "4",
        "--max-new-tokens", "4", "--temperature", "1.0", "--clip-eps", "0.2",
        "--advantage-clip", "5", "--token-cap", "12", "--learning-rate", "5e-2",
        "--warmup-steps", "0", "--lr-schedule", "constant", "--lora-rank", "4",
        "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1", "--env", env, *extra,
    ]  # fmt: skip


def default_signals() -> None:  # a background job may inherit SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def signalled(tmp_path: Path, argv: list[str], signals: list[signal.Signals]) -> tuple[int, str]:
    """Run `argv`; once the plugin blocks, send `signals` a second apart; its status and output."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "sleepy_env.py").write_text(PLUGIN)
    marker = tmp_path / "blocked"
    env = os.environ | {
        "BLOCK_MARKER": str(marker),
        "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path, preexec_fn=default_signals)  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # the start: torch, the toy model, the first turn
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the plugin was never called"
            time.sleep(0.1)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(1)
            if proc.poll() is None:
                proc.send_signal(sig)
        said, _ = proc.communicate(timeout=60)  # blocked, it would sleep for 600 s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, said


def nothing_half_written(out: Path) -> None:
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "twinrun.json").exists()
    listed = {
        json.loads(line).get("path")
        for line in (out / "twinrun.files.jsonl").read_text().splitlines()
    }
    there = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert there - {"twinrun.files.jsonl"} <= listed, there - listed


@pytest.fixture
def arithmetic(tmp_path: Path) -> Path:
    path = tmp_path / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((1, 2), (3, 4))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_a_blocked_tool_call_stops_at_once(
    tmp_path: Path, toy_model_dir: Path, arithmetic: Path, sig: signal.Signals, status: int
) -> None:
    out = tmp_path / "run"
    argv = grpo(toy_model_dir, arithmetic, out, "sleepy_env:tool", "--max-turns", "2",
                "--tool-timeout", "900")  # fmt: skip
    got, said = signalled(tmp_path, argv, [sig])
    assert got == status, said
    assert said.strip().splitlines() == [
        f"twinrun: error: interrupted ({sig.name}) during a step, which was abandoned: no "
        "checkpoint written (--checkpoint-every is off) — rerun the command with --overwrite to "
        "start again"
    ], said
    nothing_half_written(out)


def test_sigterm_then_two_ctrl_c_during_a_blocked_reward(
    tmp_path: Path, toy_model_dir: Path, arithmetic: Path
) -> None:
    """The issue's sequence, on a single-turn plugin whose reward blocks the main thread: the
    first signal already ends the wait; the Ctrl-Cs after it find the run gone or stop it."""
    out = tmp_path / "run"
    argv = grpo(toy_model_dir, arithmetic, out, "sleepy_env:reward")
    status, said = signalled(tmp_path, argv, [signal.SIGTERM, signal.SIGINT, signal.SIGINT])
    lines = said.strip().splitlines()
    assert status == 143, said
    assert len(lines) == 1 and lines[0].startswith(
        "twinrun: error: interrupted (SIGTERM) during a step, which was abandoned"
    ), said
    assert "Traceback" not in said
    nothing_half_written(out)
