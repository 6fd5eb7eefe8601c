"""Output locations checked before anything is written: a path under a regular file, on a
symlink loop, or too long gives one clear line instead of an OSError from deep inside a write."""

from __future__ import annotations

import os
from pathlib import Path

from twinrun.core.errors import OutputError


def output_path(output: str | os.PathLike[str], what: str = "--output") -> Path:
    """`output` as an absolute path whose existing ancestors are all directories."""
    p = Path(output)
    try:
        resolved = p.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise OutputError(
            f"{what} {p} cannot be resolved (a symlink loop or an unreadable path: {exc})",
            "choose a plain directory path",
        ) from exc
    for parent in [resolved, *resolved.parents]:  # the nearest one that exists
        try:
            is_dir = parent.is_dir()
            exists = is_dir or parent.exists()
        except OSError as exc:
            raise OutputError(
                f"{what} {p}: cannot inspect {parent} ({exc.strerror or exc})",
                "choose a path in a readable, writable directory",
            ) from exc
        if not exists:
            continue
        if parent != resolved and not is_dir:
            raise OutputError(
                f"{what} {p} is under {parent}, which is a file and not a directory",
                "choose a path whose parents are directories",
            )
        break
    return resolved
