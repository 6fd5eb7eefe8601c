"""Ctrl-C in one process: a SIGINT during step 1 of a 4-step loop stops it after step 1, once
the checkpoint of the 2 steps done is written; a second SIGINT stops at once; the handlers
before the loop come back after it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from twinrun.train.checkpoint import newest_checkpoint
from twinrun.train.hooks.checkpoint import Checkpointer
from twinrun.train.interrupt import Interrupted, InterruptHook, stop_signals
from twinrun.train.loop import Forward, Loop, StepForwards, StepOutcome, StepRecipe, make_optimizer


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
