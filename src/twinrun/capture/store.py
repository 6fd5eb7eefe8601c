"""Writing a capture: every file appears atomically and never replaces an existing one, and the
manifest — the commit marker — is written last. A crash leaves at most files without a
manifest, which no replay accepts (a replay starts from the pinned manifest)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from twinrun.core.errors import OutputError
from twinrun.core.fileio import fsync_dir
from twinrun.core.ledger import note_written


def _refuse(path: Path) -> OutputError:
    return OutputError(
        f"capture file {path} already exists; a capture is never overwritten",
        "write the run to a new [logging] dir",
    )


def write_new_with(path: Path, write: Callable[[str], None]) -> None:
    """Produce `path` through `write(tmp)`; fsync, then link it into place only if nothing is
    there (the check and the creation are one atomic step: os.link fails on an existing name)."""
    if path.exists():
        raise _refuse(path)
    note_written(path)  # listed before its folder is made: a full disk leaves none unlisted
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise _refuse(path) from None
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def write_new(path: Path, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    write_new_with(path, write)


def new_dir(path: Path) -> Path:
    """Create a directory that must not exist yet."""
    note_written(path)
    try:
        path.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise _refuse(path) from None
    fsync_dir(path.parent)
    return path


def check_free(paths: list[Path]) -> None:
    """Refuse before writing anything when any target already exists."""
    for p in paths:
        if p.exists():
            raise _refuse(p)
