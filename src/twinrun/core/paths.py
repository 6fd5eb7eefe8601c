"""Output locations checked before anything is written (and before any model loads): a symbolic
link (dangling or not), a path under a regular file, on a symlink loop, too long, or in a
directory this process cannot write gives one clear line instead of an OSError from deep inside
a write, after the work."""

from __future__ import annotations

import os
from pathlib import Path

from twinrun.core.errors import OutputError

NO_LINK_HINT = "give the directory itself, or a new path: twinrun never writes through a link"


def _inspect_error(what: str, p: Path, where: Path, exc: OSError) -> OutputError:
    return OutputError(
        f"{what} {p}: cannot inspect {where} ({exc.strerror or exc})",
        "choose a path in a readable, writable directory",
    )


def _resolved_output(p: Path, what: str) -> Path:
    """`p` resolved, refused when it is a symbolic link itself, cannot be inspected, or does not
    resolve (a symlink loop, an unreadable path)."""
    try:
        link = p.is_symlink()
    except OSError as exc:  # a name too long, a parent that cannot be searched
        raise _inspect_error(what, p, p, exc) from exc
    if link:
        raise OutputError(f"{what} {p} is a symbolic link (to {os.readlink(p)})", NO_LINK_HINT)
    try:
        return p.resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        raise OutputError(
            f"{what} {p} cannot be resolved (a symlink loop or an unreadable path: {exc})",
            "choose a plain directory path",
        ) from exc


def _nearest_existing(p: Path, resolved: Path, what: str) -> tuple[Path, bool] | None:
    """The nearest of `resolved` and its ancestors that exists, and whether it is a directory
    (None when none exists); refused when one cannot be inspected."""
    for parent in [resolved, *resolved.parents]:
        try:
            is_dir = parent.is_dir()
            exists = is_dir or parent.exists()
        except OSError as exc:
            raise _inspect_error(what, p, parent, exc) from exc
        if exists:
            return parent, is_dir
    return None


def _check_receivers(p: Path, resolved: Path, parent: Path, is_dir: bool, what: str) -> None:
    """Refuse an output under a file, or whose receiving directories (its nearest existing
    ancestor, and the output itself when it is an existing directory) this process cannot
    write."""
    if parent != resolved and not is_dir:
        raise OutputError(
            f"{what} {p} is under {parent}, which is a file and not a directory",
            "choose a path whose parents are directories",
        )
    receivers = [parent] if parent != resolved else [resolved.parent]
    if parent == resolved and is_dir:
        receivers.append(resolved)  # a run writes into it; its lock goes beside it
    for d in receivers:
        if not os.access(d, os.W_OK | os.X_OK):
            raise OutputError(
                f"{what} {p}: the directory {d} is not writable by this process",
                "choose a path in a writable directory, or change its permissions",
            )


def output_path(output: str | os.PathLike[str], what: str = "--output") -> Path:
    """`output` as an absolute path: not a symbolic link itself, its existing ancestors all
    directories, and the directory that receives it (the output itself when it is an existing
    directory, and the nearest existing ancestor) writable by this process."""
    p = Path(output)
    resolved = _resolved_output(p, what)
    nearest = _nearest_existing(p, resolved, what)
    if nearest is not None:
        _check_receivers(p, resolved, *nearest, what)
    return resolved


def output_file(output: str | os.PathLike[str], overwrite: bool, what: str = "--output") -> Path:
    """A file output (a report, an extract): as `output_path`, and not an existing directory;
    an existing file only with `overwrite`. Changes nothing on disk."""
    resolved = output_path(output, what)
    if resolved.is_dir():
        raise OutputError(f"{what} {output} is a directory, not a file", "give a file path")
    if resolved.exists() and not overwrite:
        raise OutputError(f"{output} exists", f"choose another {what} or pass --overwrite")
    return resolved
