"""A signal while a step waits on an environment's code that does not return (a tool call that
sleeps, a reward that sleeps), as a real process: the step is abandoned at once and the run
stops in one `interrupted` line — exit 143 for SIGTERM, 130 for Ctrl-C — with no adapter, no
sidecar and no file the run's list of written files does not name. Signals the process gets
together (it could not run between them) name SIGTERM, and signals after the stop change nothing.

The bound on the wait is far from the expected time (about a second): it only tells "stopped"
from "still blocked in a 600 s sleep". Where the order matters, the plugin waits in C code for
the test to say it is done (a named pipe), not on a clock."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLUGIN = """
import atexit
import os
import signal
import time

SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _blocked():
    open(os.environ["BLOCK_MARKER"], "w").close()  # the test signals from here on
    time.sleep(600)


def _wait_for_the_test():  # in C code (a read of a named pipe) until the test writes to it
    pipe = os.open(os.environ["RELEASE_PIPE"], os.O_RDWR)  # no wait for a writer
    os.read(pipe, 1)


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


class DeafReward(SleepyReward):  # the process cannot act on a signal until the test is done
    def reward(self, row, completion):
        if completion:
            signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
            open(os.environ["BLOCK_MARKER"], "w").close()
            _wait_for_the_test()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
            time.sleep(600)
        return 1.0


def _on_the_way_out():
    open(os.environ["EXIT_MARKER"], "w").close()
    _wait_for_the_test()


def tool():
    return Sleepy()


def reward():
    return SleepyReward()


def deaf_reward():
    return DeafReward()


def reward_then_slow_exit():  # called for each group: the exit hook is registered once
    atexit.unregister(_on_the_way_out)
    atexit.register(_on_the_way_out)  # runs as the process exits, after twinrun said its line
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


class Run:
    """`argv` as a process, with the plugin on its path; the test waits for the plugin's
    markers, signals it and releases the plugin's wait on the named pipe."""

    def __init__(self, tmp_path: Path, argv: list[str]) -> None:
        plugins = tmp_path / "plugins"
        plugins.mkdir()
        (plugins / "sleepy_env.py").write_text(PLUGIN)
        self.blocked, self.exiting = tmp_path / "blocked", tmp_path / "exiting"
        self.pipe = tmp_path / "release"
        os.mkfifo(self.pipe)
        env = os.environ | {
            "BLOCK_MARKER": str(self.blocked),
            "EXIT_MARKER": str(self.exiting),
            "RELEASE_PIPE": str(self.pipe),
            "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=tmp_path,
                                     preexec_fn=default_signals)  # fmt: skip

    def wait_for(self, marker: Path) -> None:
        deadline = time.monotonic() + 300  # the start: torch, the toy model, the first turn
        while not marker.exists():
            assert self.proc.poll() is None, self.proc.communicate()[0]
            assert time.monotonic() < deadline, f"the plugin never wrote {marker.name}"
            time.sleep(0.1)

    def send(self, signals: list[signal.Signals], gap: float) -> None:
        for i, sig in enumerate(signals):
            if i:
                time.sleep(gap)
            if self.proc.poll() is None:
                self.proc.send_signal(sig)

    def release(self) -> None:
        """Write to the pipe the plugin waits on (once the plugin has it open)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                pipe = os.open(self.pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:  # ENXIO: not open yet
                assert exc.errno == errno.ENXIO, exc
            else:
                os.write(pipe, b"x")
                os.close(pipe)
                return
            assert self.proc.poll() is None, self.proc.communicate()[0]
            assert time.monotonic() < deadline, "the plugin never opened the pipe"
            time.sleep(0.05)

    def finish(self) -> tuple[int, str]:
        """Its exit status and output (blocked, it would sleep for 600 s: TimeoutExpired)."""
        said, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, said

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed test leaves no process behind
            self.proc.kill()
            self.proc.communicate()


def signalled(tmp_path: Path, argv: list[str], signals: list[signal.Signals]) -> tuple[int, str]:
    """Run `argv`; once the plugin blocks, send `signals` a second apart; its status and output."""
    with Run(tmp_path, argv) as run:
        run.wait_for(run.blocked)
        run.send(signals, gap=1)
        return run.finish()


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
    only_the_sigterm_line(status, said, out)


def only_the_sigterm_line(status: int, said: str, out: Path) -> None:
    lines = said.strip().splitlines()
    assert status == 143, said
    assert len(lines) == 1 and lines[0].startswith(
        "twinrun: error: interrupted (SIGTERM) during a step, which was abandoned"
    ), said
    nothing_half_written(out)


def test_signals_that_come_together_name_sigterm(
    tmp_path: Path, toy_model_dir: Path, arithmetic: Path
) -> None:
    """SIGTERM, then two Ctrl-Cs, all before the process can act on any (as on a loaded
    machine): Python runs the handlers in the order of the signals' numbers, SIGINT first, and
    the run still reports the SIGTERM."""
    out = tmp_path / "run"
    with Run(tmp_path, grpo(toy_model_dir, arithmetic, out, "sleepy_env:deaf_reward")) as run:
        run.wait_for(run.blocked)
        run.send([signal.SIGTERM, signal.SIGINT, signal.SIGINT], gap=0.05)
        run.release()
        status, said = run.finish()
    only_the_sigterm_line(status, said, out)


def test_ctrl_c_while_the_stopped_run_exits_changes_nothing(
    tmp_path: Path, toy_model_dir: Path, arithmetic: Path
) -> None:
    """SIGTERM stops the run; two Ctrl-Cs come while the process exits, after twinrun said its
    line (an exit hook of the plugin waits for the test): no traceback, status still 143."""
    out = tmp_path / "run"
    argv = grpo(toy_model_dir, arithmetic, out, "sleepy_env:reward_then_slow_exit")
    with Run(tmp_path, argv) as run:
        run.wait_for(run.blocked)
        run.send([signal.SIGTERM], gap=0)
        run.wait_for(run.exiting)
        run.send([signal.SIGINT, signal.SIGINT], gap=0.05)
        run.release()
        status, said = run.finish()
    only_the_sigterm_line(status, said, out)
