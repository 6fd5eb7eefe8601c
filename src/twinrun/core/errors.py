"""The error hierarchy. Every error a user can cause is a TwinrunError: the CLI prints its one
line (what is wrong, then what to do) and exits non-zero; a traceback only with TWINRUN_DEBUG=1.

Each class also subclasses the builtin that fits, so callers catching ValueError or OSError keep
working (the PEFT habit).
"""

from __future__ import annotations

import errno
import os


class TwinrunError(Exception):
    """Base class. `hint` says what to do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


class ConfigError(TwinrunError, ValueError):
    """A flag or config key is missing, malformed or contradicts another."""


class DataError(TwinrunError, ValueError):
    """An examples file (or other input data) is missing, empty or malformed."""


class ModelError(TwinrunError, ValueError):
    """A model or adapter directory is missing or is not a usable checkpoint."""


class OutputError(TwinrunError, OSError):
    """An output path exists, cannot be written, or would be overwritten."""


class ContractError(TwinrunError, RuntimeError):
    """A determinism or replay contract does not hold (e.g. strict mode could not be set)."""


class IntegrityError(TwinrunError, ValueError):
    """A pinned SHA256 does not match: `Expected sha256 <x>  Got <y>` for a path."""

    def __init__(self, expected: str, got: str, path: str, hint: str | None = None) -> None:
        super().__init__(f"{path}: Expected sha256 {expected}  Got {got}", hint)
        self.expected = expected
        self.got = got
        self.path = path


def write_failed(path: str | os.PathLike[str], exc: BaseException) -> OutputError:
    """The one line for an OS error met while writing `path`."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    reason = getattr(exc, "strerror", None) or first
    if getattr(exc, "errno", None) == errno.ENOSPC or "No space left" in str(exc):
        hint = "free some space (or choose an output on another disk) and rerun"
    elif getattr(exc, "errno", None) == errno.EFBIG:
        hint = "the file outgrew this process's file-size limit (ulimit -f): raise it and rerun"
    else:
        hint = "check that the location exists, is a directory and is writable"
    return OutputError(f"cannot write {path}: {reason}", hint)


MEMORY_WORDS = ("Cannot allocate memory", "failed to map segment", "can't start new thread")


def memory_failure(exc: BaseException) -> str | None:
    """What ran out when `exc` is a memory limit met anywhere (Python's MemoryError, an OS error
    ENOMEM, a library that could not allocate, map a file or start a thread), else None."""
    if isinstance(exc, MemoryError):
        return "MemoryError"
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return "ENOMEM"
    if any(words in str(exc) for words in MEMORY_WORDS):
        return type(exc).__name__
    return None
