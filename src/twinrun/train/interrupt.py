"""Ctrl-C during training: finish the step, stop every process after the same step, and keep it.

While the steps run, SIGINT and SIGTERM only ask the run to stop (`StopSignals`). After each
step (once every other hook has written the step out) `InterruptHook` asks every process
whether any of them was asked — one all-reduce under torchrun, so all processes stop after the
same step, whichever of them got the signal and when — and then, with `--checkpoint-every` on,
writes the checkpoint of the steps done (unless that step's is already there) and raises
`Interrupted` (exit status 130; 143 for SIGTERM). `--resume` continues from it with the bytes of
an uninterrupted run.

A second signal, of either kind, abandons the step under way at once, and so does a first one
while the step waits on an environment's code (a tool call that sleeps may never return:
core/interrupts.py). An abandoned step writes nothing more; the newest checkpoint stays, as after
a kill, and the run stops with the same `interrupted` line and exit status.

The line and the status name SIGTERM when a SIGTERM came before the run ended, whatever came with
it: signals that arrive while the process cannot run (a loaded machine, a wait in C code) are
handled in the order of their numbers, SIGINT first, not in the order they were sent; and
SIGTERM is the one a job scheduler sends and reads back (143). Once the steps have ended on a
signal, a later one changes nothing: the run is on its way out.

torchrun passes a SIGINT it gets on to every process and kills the ones still running 30 s
later: the step under way must end within that for the run to be kept.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import torch

from twinrun.core import interrupts
from twinrun.core.errors import TwinrunError
from twinrun.train.hooks.checkpoint import Checkpointer
from twinrun.train.outputs.checkpoint import newest_checkpoint
from twinrun.train.parallel import distributed
from twinrun.train.step.loop import Hook, Phase, StepView

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(TwinrunError):
    """The run stopped because it was asked to (SIGINT / SIGTERM): after a finished step, or at
    once with the step under way abandoned. Exit status 128 + the signal's number, as a shell
    reports a process the signal ended: 130 for SIGINT, 143 for SIGTERM."""

    exit_code = 130

    def __init__(self, message: str, hint: str | None = None, name: str = "SIGINT") -> None:
        super().__init__(message, hint)
        self.exit_code = 128 + int(signal.Signals[name]) if name in NAMES else 130


NAMES = {sig.name for sig in SIGNALS}
RANK = {"SIGTERM": 0, "SIGINT": 1}  # which signal the run reports when both came


class InterruptHook(Hook):
    """Stops the run after the step in which a stop was asked (registered last: it runs after
    every other hook of the step's end)."""

    points = {"after_step": Phase.PERSIST}

    def __init__(self, checkpointer: Checkpointer | None) -> None:
        self.checkpointer = checkpointer
        self.asked: str | None = None  # the signal's name, once one arrived

    def ask(self, name: str) -> None:
        if self.asked is None or RANK[name] < RANK[self.asked]:
            self.asked = name

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        done = view.step + 1
        device = view.params[0][1].device if view.params else torch.device("cpu")
        if not self.agreed(device) or done >= view.total_steps:
            return  # the last step: the run's outputs follow, as without a signal
        kept = "no checkpoint written (--checkpoint-every is off)"
        hint = "rerun the command with --overwrite to start again"
        if self.checkpointer is not None:
            if not self.checkpointer.exists(done):
                self.checkpointer.write(view, done)
            kept = f"checkpoint step-{done:06d} written"
            hint = "rerun the same command with --resume to continue from it"
        interrupts.end()
        raise Interrupted(
            f"interrupted ({self.asked or 'another process was'}) with {done} of "
            f"{view.total_steps} steps done: {kept}",
            hint,
            self.asked or "SIGINT",
        )

    def abandoned(self, name: str, total_steps: int) -> Interrupted:
        """The error for a step abandoned at once: what the newest checkpoint keeps."""
        asked = self.asked or name
        ckpt = newest_checkpoint(self.checkpointer.out) if self.checkpointer is not None else None
        if ckpt is not None:
            done = ckpt.steps_done
            kept = f"checkpoint step-{done:06d} kept ({done} of {total_steps} steps done)"
            hint = "rerun the same command with --resume to continue from it"
        else:
            kept = "no checkpoint written" + (
                "" if self.checkpointer is not None else " (--checkpoint-every is off)"
            )
            hint = "rerun the command with --overwrite to start again"
        return Interrupted(
            f"interrupted ({asked}) during a step, which was abandoned: {kept}", hint, asked
        )

    def agreed(self, device: torch.device) -> bool:
        """Whether any process was asked to stop (each process gives the same answer); the
        flag lives on the parameters' device (nccl reduces CUDA tensors only)."""
        if not distributed.active():
            return self.asked is not None
        flag = torch.tensor([int(self.asked is not None)], dtype=torch.int64, device=device)
        dist = distributed._dist()
        with distributed.collective("agreeing whether to stop"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@contextmanager
def stop_signals(hook: InterruptHook) -> Iterator[None]:
    """SIGINT / SIGTERM ask `hook` to stop the run; a second of either kind, or one that comes
    while the step waits on an environment's code, abandons the step at once (`StopNow`); once
    the steps have ended on a signal, one more does nothing. The previous handlers come back on
    leaving (`interrupts.ending()` still tells the caller how the steps ended). Nothing off the
    main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def asked(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        again = hook.asked is not None
        hook.ask(name)
        if interrupts.ending():  # the steps have ended on a signal: too late to change anything
            return
        interrupts.ask_stop(name)
        if again or interrupts.waiting():
            interrupts.end()
            raise interrupts.StopNow(hook.asked or name)

    interrupts.STOP.clear()
    interrupts.ENDING.clear()
    for sig in SIGNALS:
        signal.signal(sig, asked)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        interrupts.STOP.clear()
