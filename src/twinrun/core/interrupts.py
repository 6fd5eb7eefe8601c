"""Ctrl-C that a library swallowed. The CLI's SIGINT handler notes every Ctrl-C here before it
raises KeyboardInterrupt. Raised inside a library's `__del__` (or a callback whose exceptions the
library ignores), that KeyboardInterrupt is dropped — Python prints it and goes on — and the
command would finish as if no Ctrl-C had come. So a writer calls `check()` just before it puts
its output in place: a Ctrl-C it missed stops it there, with nothing half-written."""

from __future__ import annotations

SEEN: list[str] = []  # the signals noted, in order


def note(name: str = "SIGINT") -> None:
    SEEN.append(name)


def check() -> None:
    """KeyboardInterrupt when a Ctrl-C has been noted (whether or not its own was swallowed)."""
    if SEEN:
        raise KeyboardInterrupt
