"""Ctrl-C in one process: a SIGINT during step 1 of a 4-step loop stops it after step 1, once
the checkpoint of the 2 steps done is written; a second SIGINT stops at once; the handlers
before the loop come back after it."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from twinrun.core import interrupts
from twinrun.train.hooks.checkpoint import Checkpointer
from twinrun.train.interrupt import Interrupted, InterruptHook, stop_signals
from twinrun.train.outputs.checkpoint import newest_checkpoint
from twinrun.train.step.loop import (
    Forward,
    Loop,
    StepForwards,
    StepOutcome,
    StepRecipe,
    make_optimizer,
)


class SignalsAt(StepRecipe):
    """One forward a step; during step `at` this process gets `times` SIGINTs."""

    def __init__(self, param: torch.nn.Parameter, at: int, times: int = 1) -> None:
        self.param, self.at, self.times = param, at, times
        self.steps: list[int] = []

    def prepare(self, step: int) -> None:
        return None

    def forwards(self, step: int, batch: None) -> StepForwards:
        self.steps.append(step)
        if step == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)
        yield Forward(self.param.square().sum())
        return StepOutcome(loss=float(self.param.detach().square().sum()), tokens=1, rows=1)


def loop_with(hook: InterruptHook) -> tuple[Loop, torch.nn.Parameter]:
    param = torch.nn.Parameter(torch.ones(3))
    params = [("p", param)]
    loop = Loop(
        params=params, optimizer=make_optimizer(params, 0.1, (0.9, 0.999), 1e-8, 0.0),
        base_lr=0.1, warmup_steps=0, total_steps=4, hooks=[hook], schedule="constant",
    )  # fmt: skip
    return loop, param


def test_sigint_stops_after_the_step_with_its_checkpoint(tmp_path: Path) -> None:
    hook = InterruptHook(Checkpointer(tmp_path, {"seed": 1}))
    loop, param = loop_with(hook)
    recipe = SignalsAt(param, at=1)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as raised, stop_signals(hook):
        loop.run(recipe, 0)
    assert signal.getsignal(signal.SIGINT) is before
    assert recipe.steps == [0, 1]  # step 1 finished, step 2 never started
    assert raised.value.exit_code == 130
    assert raised.value.one_line() == (
        "interrupted (SIGINT) with 2 of 4 steps done: checkpoint step-000002 written — rerun the "
        "same command with --resume to continue from it"
    )
    ckpt = newest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.steps_done == 2
    assert len(ckpt.state["metrics"]) == 2


def test_without_checkpoints_it_says_nothing_was_kept(tmp_path: Path) -> None:
    hook = InterruptHook(None)
    loop, param = loop_with(hook)
    said = "with 1 of 4 steps done: no checkpoint written"
    with pytest.raises(Interrupted, match=said) as raised, stop_signals(hook):
        loop.run(SignalsAt(param, at=0), 0)
    assert raised.value.one_line().endswith("— rerun the command with --overwrite to start again")
    assert not (tmp_path / "checkpoints").exists()


def test_a_second_sigint_stops_at_once(tmp_path: Path) -> None:
    hook = InterruptHook(Checkpointer(tmp_path, {"seed": 1}))
    loop, param = loop_with(hook)
    recipe = SignalsAt(param, at=1, times=2)
    with pytest.raises(KeyboardInterrupt), stop_signals(hook):
        loop.run(recipe, 0)
    assert recipe.steps == [0, 1] and newest_checkpoint(tmp_path) is None


def test_a_signal_in_the_last_step_lets_the_run_finish(tmp_path: Path) -> None:
    hook = InterruptHook(Checkpointer(tmp_path, {"seed": 1}))
    loop, param = loop_with(hook)
    with stop_signals(hook):
        loop.run(SignalsAt(param, at=3), 0)  # its outputs follow, as without a signal
    assert len(loop.metrics) == 4 and newest_checkpoint(tmp_path) is None


def one_forward(param: torch.nn.Parameter) -> StepForwards:
    yield Forward(param.square().sum())
    return StepOutcome(loss=float(param.detach().square().sum()), tokens=1, rows=1)


class Sends(SignalsAt):
    """During step `at` this process gets `signals`, in order."""

    def __init__(self, param: torch.nn.Parameter, at: int, signals: list[signal.Signals]) -> None:
        super().__init__(param, at, times=0)
        self.signals = signals

    def forwards(self, step: int, batch: None) -> StepForwards:
        self.steps.append(step)
        if step == self.at:
            for sig in self.signals:
                os.kill(os.getpid(), sig)
        return (yield from one_forward(self.param))


def test_sigterm_stops_with_143_and_a_second_signal_of_another_kind_at_once(
    tmp_path: Path,
) -> None:
    hook = InterruptHook(Checkpointer(tmp_path, {"seed": 1}))
    loop, param = loop_with(hook)
    with pytest.raises(Interrupted) as raised, stop_signals(hook):
        loop.run(Sends(param, at=0, signals=[signal.SIGTERM]), 0)
    assert raised.value.exit_code == 143
    assert raised.value.message.startswith("interrupted (SIGTERM) with 1 of 4 steps done")
    hook = InterruptHook(Checkpointer(tmp_path / "again", {"seed": 1}))
    loop, param = loop_with(hook)
    recipe = Sends(param, at=1, signals=[signal.SIGTERM, signal.SIGINT])
    with pytest.raises(interrupts.StopNow) as stopped, stop_signals(hook):
        loop.run(recipe, 0)
    assert stopped.value.name == "SIGTERM" and recipe.steps == [0, 1]
    abandoned = hook.abandoned(stopped.value.name, 4)
    assert abandoned.exit_code == 143
    assert abandoned.one_line() == (
        "interrupted (SIGTERM) during a step, which was abandoned: no checkpoint written — "
        "rerun the command with --overwrite to start again"
    )
    assert interrupts.STOP == []  # cleared on leaving


class WaitsOnEnvironment(SignalsAt):
    """Step `at` asks to stop, then waits on an environment's code (or asks during the wait)."""

    def __init__(self, param: torch.nn.Parameter, at: int, during: bool) -> None:
        super().__init__(param, at, times=0)
        self.during, self.returned = during, False

    def forwards(self, step: int, batch: None) -> StepForwards:
        self.steps.append(step)
        if step == self.at:
            if not self.during:
                os.kill(os.getpid(), signal.SIGINT)
            with interrupts.abandonable():
                if self.during:
                    os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler runs in here at the latest
                self.returned = True
        return (yield from one_forward(self.param))


@pytest.mark.parametrize("during", [False, True])
def test_a_stop_abandons_a_wait_on_an_environment(tmp_path: Path, during: bool) -> None:
    hook = InterruptHook(Checkpointer(tmp_path, {"seed": 1}))
    loop, param = loop_with(hook)
    recipe = WaitsOnEnvironment(param, at=2, during=during)
    with pytest.raises(interrupts.StopNow), stop_signals(hook):
        loop.run(recipe, 0)
    assert not recipe.returned and recipe.steps == [0, 1, 2]
    assert len(loop.metrics) == 2  # step 2 wrote nothing
    assert (
        hook.abandoned("SIGINT", 4)
        .one_line()
        .endswith("no checkpoint written — rerun the command with --overwrite to start again")
    )


def test_outside_the_steps_a_wait_is_not_abandoned() -> None:
    with interrupts.abandonable():
        assert interrupts.waiting()
    assert not interrupts.waiting()


def test_sigterm_outranks_a_ctrl_c_that_came_with_it(tmp_path: Path) -> None:
    """A Ctrl-C, then a SIGTERM in the same step: the step is abandoned and the run reports the
    SIGTERM (143), as it does when the two arrive together and Python runs SIGINT's handler
    first; a SIGINT after a SIGTERM does not take its place."""
    hook = InterruptHook(None)
    loop, param = loop_with(hook)
    with pytest.raises(interrupts.StopNow) as stopped, stop_signals(hook):
        loop.run(Sends(param, at=1, signals=[signal.SIGINT, signal.SIGTERM]), 0)
    assert stopped.value.name == "SIGTERM"
    assert hook.abandoned(stopped.value.name, 4).exit_code == 143
    hook.ask("SIGINT")
    assert hook.asked == "SIGTERM"


def test_a_signal_after_the_steps_ended_on_one_changes_nothing() -> None:
    """Once a stop has ended the steps (as the hooks close after it), one more signal raises
    nothing: the run's `interrupted` error goes on out as it was."""
    hook = InterruptHook(None)
    loop, param = loop_with(hook)
    with pytest.raises(Interrupted) as raised, stop_signals(hook):
        try:
            loop.run(Sends(param, at=0, signals=[signal.SIGTERM]), 0)
        finally:
            assert interrupts.ending()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)  # the handler runs in here at the latest
    assert raised.value.exit_code == 143
    assert raised.value.message.startswith("interrupted (SIGTERM) with 1 of 4 steps done")


def test_a_new_run_starts_with_no_stop_and_no_end() -> None:
    interrupts.ask_stop("SIGINT")
    interrupts.end()
    with stop_signals(InterruptHook(None)):
        assert interrupts.STOP == [] and not interrupts.ending()


def test_a_stop_another_thread_received_ends_a_wait_on_an_environment() -> None:
    """The kernel may give a SIGINT to a thread other than the main one (a process stopped and
    continued): the main thread's wait on a tool call is not woken by it, and would last until
    the tool's time limit (30 s here); waited in slices, the handler runs while the tool call
    still waits (it waits 10 s for that at most) and the stop ends the wait."""
    from twinrun.rl.tool_base import bounded

    hook = InterruptHook(None)
    seen: list[bool] = []

    def tool() -> None:  # waits until the run's handler has run, or 10 s
        deadline = time.monotonic() + 10
        while hook.asked is None and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append(hook.asked is not None)

    quiet = threading.Event()
    receiver = threading.Thread(target=quiet.wait, daemon=True)  # a thread the signal may go to
    receiver.start()
    with stop_signals(hook):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # never the main thread
        try:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            with pytest.raises(interrupts.StopNow):
                bounded(30, tool)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            quiet.set()
    deadline = time.monotonic() + 20
    while not seen and time.monotonic() < deadline:  # the abandoned call ends on its own
        time.sleep(0.01)
    assert seen == [True]  # the handler ran during the call, not after its time limit
