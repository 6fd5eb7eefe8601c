"""Ctrl-C and SIGTERM: what a library swallowed, and the stop a run's steps were asked for.

The CLI's SIGINT handler notes every Ctrl-C here before it raises KeyboardInterrupt. Raised
inside a library's `__del__` (or a callback whose exceptions the library ignores), that
KeyboardInterrupt is dropped — Python prints it and goes on — and the command would finish as if
no Ctrl-C had come. So a writer calls `check()` just before it puts its output in place: a Ctrl-C
it missed stops it there, with nothing half-written.

While a run's steps go on, a first SIGINT or SIGTERM only asks the run to stop after the step
under way (train/interrupt.py notes it in `STOP`). A step that waits on an environment's code (a
tool call, a reset, a reward) waits inside `abandonable()`: a stop asked before or during that
wait ends it at once with `StopNow` — the code may never return — and the step is abandoned, as a
second signal abandons any step. Once a signal has ended the steps (`end()`), the run is on its
way out: a later signal changes nothing, neither the line it prints nor its exit status
(`ending()`). This module does not import torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SEEN: list[str] = []  # the signals noted, in order
STOP: list[str] = []  # the signals that asked the steps under way to stop, in order
ENDING: list[bool] = []  # non-empty once a signal has ended a run's steps (until the next run's)
_WAITS = [0]  # how many abandonable waits are under way (on the main thread)
SLICE_S = 0.1  # a wait on another thread wakes this often to run the handlers of signals


def note(name: str = "SIGINT") -> None:
    SEEN.append(name)


def check() -> None:
    """KeyboardInterrupt when a Ctrl-C has been noted (whether or not its own was swallowed)."""
    if SEEN:
        raise KeyboardInterrupt


class StopNow(KeyboardInterrupt):
    """The step under way is abandoned because signal `name` asked the run to stop."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def ask_stop(name: str) -> None:
    STOP.append(name)


def end() -> None:
    """The run's steps are over because of a signal: what it reports is decided."""
    ENDING[:] = [True]


def ending() -> bool:
    """Whether a signal has ended the run's steps (a later one is then too late to matter)."""
    return bool(ENDING)


def waiting() -> bool:
    """Whether the main thread waits on an environment's code just now."""
    return _WAITS[0] > 0


@contextmanager
def abandonable() -> Iterator[None]:
    """A wait that a stop ends at once: StopNow on entry when one was asked already, and the
    stop handler raises StopNow into the wait when one is asked during it."""
    if STOP:
        end()
        raise StopNow(STOP[0])
    if threading.current_thread() is not threading.main_thread():
        yield  # a signal's handler runs on the main thread: it cannot end this wait
        return
    _WAITS[0] += 1
    try:
        yield
    finally:
        _WAITS[0] -= 1


def join(thread: threading.Thread, timeout_s: float) -> None:
    """`thread.join(timeout_s)` in slices of SLICE_S. A signal's handler runs on the main thread
    only, and a wait in C code is woken only when the kernel gave the signal to the main thread;
    when another thread took it (a process stopped and continued, say), the handler runs at the
    next slice, not when the wait times out."""
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        thread.join(min(left, SLICE_S))
