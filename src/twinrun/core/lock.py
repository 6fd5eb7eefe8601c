"""An exclusive lock on an output directory, so two writers can never share one run.

The lock is a file next to the directory (`.<name>.twinrun-lock`, so it never makes the directory
non-empty and survives `--overwrite` emptying it), created atomically with O_CREAT|O_EXCL and
holding the owner's PID. It is removed on release and at interpreter exit. A lock whose PID is no
longer alive (a killed run) is stale and is taken over; so is one this process left behind (a
command that failed mid-run inside a longer-lived process, such as a test or a notebook).

A lock must hold a process id as twinrun writes it (decimal digits, 1 to PID_MAX, a newline). An
empty lock is one being written this instant: it is read again for a moment before anything is
decided. Anything else (text, a number no process can have) was not written by twinrun, and the
lock is left alone with a one-line error rather than guessed about.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from twinrun.core.errors import OutputError
from twinrun.core.paths import output_path

PID_MAX = 1 << 22  # the largest pid_max Linux allows
_HELD: dict[Path, list[Path]] = {}  # lock file -> directories made for it, deepest first


def lock_path(output: str | os.PathLike[str]) -> Path:
    p = output_path(output)
    return p.parent / f".{p.name}.twinrun-lock"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def _owner(lock: Path, wait_s: float = 1.0) -> int | None:
    """The PID a lock holds; None when it is gone. OutputError when it holds anything but a PID
    (after waiting up to `wait_s` for an empty one — its creator writes it right after)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            raw = lock.read_bytes()[:64]
        except FileNotFoundError:
            return None
        if raw or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    text = raw.decode("ascii", errors="replace")
    digits = text.removesuffix("\n")
    if digits.isascii() and digits.isdigit() and len(digits) <= 8 and 1 <= int(digits) <= PID_MAX:
        return int(digits)
    raise OutputError(
        f"the lock {lock} holds {text[:20]!r}, not a process id",
        "it was not written by twinrun: remove it if no twinrun process is writing that output",
    )


def _try_create(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def acquire(output: str | os.PathLike[str]) -> Path:
    """Take the lock of `output` (its parent directory is created if missing, and removed again on
    release if nothing was put in it); returns the lock file. OutputError when another live
    process holds it."""
    lock = lock_path(output)
    made = [d for d in [lock.parent, *lock.parent.parents] if not d.exists()]
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"--output {output}: cannot create {lock.parent} ({exc.strerror or exc})",
            "choose an --output whose parent is a writable directory",
        ) from exc
    for _ in range(3):
        try:
            if _try_create(lock):
                _HELD[lock] = made
                return lock
        except OSError as exc:
            raise OutputError(
                f"--output {output}: cannot write the lock {lock} ({exc.strerror or exc})",
                "choose an --output in a writable directory",
            ) from exc
        pid = _owner(lock)
        if pid is None:
            continue  # released between our attempt and the read: try again
        mine = pid == os.getpid()  # left by an earlier, failed call in this process
        if pid and _pid_alive(pid) and not mine:
            raise OutputError(
                f"--output {output} is in use by another twinrun process (pid {pid})",
                f"wait for it to finish, or choose another --output; remove {lock} only if "
                "that process is not twinrun",
            )
        try:  # stale: its owner is dead
            lock.unlink()
        except FileNotFoundError:
            pass
    raise OutputError(
        f"--output {output}: could not take the lock {lock}", "retry, or choose another --output"
    )


def release(lock: Path) -> None:
    """Remove the lock, and the parent directories taken for it when they stayed empty."""
    if lock not in _HELD:
        return
    made = _HELD.pop(lock)
    try:
        mine = _owner(lock, wait_s=0) == os.getpid()
    except OutputError:
        mine = False  # replaced by something that is not ours: leave it
    if mine:
        try:
            lock.unlink()
        except FileNotFoundError:
            pass
    for d in made:
        try:
            d.rmdir()
        except OSError:
            break


@contextmanager
def output_lock(output: str | os.PathLike[str]) -> Iterator[Path]:
    """`with output_lock(dir):` — the directory is this process's alone inside the block."""
    lock = acquire(output)
    try:
        yield lock
    finally:
        release(lock)


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD):
        release(lock)
