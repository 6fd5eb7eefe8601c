"""Atomic file writes: a temporary name in the same directory, flush, fsync, rename, then fsync
the directory. A reader sees the old file or the whole new one, never half of one. An OS error
(a full disk, a read-only or missing location) becomes one OutputError naming the path, and the
temporary file is removed."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from twinrun.core.errors import OutputError, write_failed
from twinrun.core.ledger import note_written


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_write_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError"


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to produce the file, then fsync and rename it onto `path`."""
    path = Path(path)
    tmp = None
    try:
        note_written(path)  # listed first (before its folder) when it lies in a run directory
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OutputError) or not _is_write_error(exc):
            raise
        raise write_failed(path, exc) from exc


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write_with(path, write)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


def atomic_write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=False) + "\n" for r in rows))
