"""Clearing only what twinrun wrote. A directory is walked against a declared layout — each entry
a name twinrun writes there: a file, or a folder with its own layout — and `--overwrite` removes
exactly the entries the walk matched, deepest first (files unlinked, folders removed only once
empty, so nothing the walk did not see can go). Anything else stops the walk before a byte is
removed: a name twinrun never writes, a symbolic link (never followed: twinrun writes none), a
file where twinrun writes a folder or the other way round, a socket or a device.

Beside every file name of a layout, the leftover of a killed atomic write of it
(`.NAME.<random>.tmp`, as `core.fileio` and `capture.store` make them) is twinrun's too.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twinrun.core.errors import OutputError

# a regular expression (matched against the whole name) -> None for a file, or the folder's layout
Layout = Mapping[str, "Layout | None"]
KILLED_WRITE = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")
# a folder another library writes into (a tracker's logs): any files, folders and links (wandb
# links latest-run); clearing it unlinks a link and never follows one
ANY_TREE: Layout = {".+": None}


@dataclass
class Survey:
    """What a walk found: the entries twinrun wrote, deepest first, or the first one it did not."""

    entries: list[Path] = field(default_factory=list)
    foreign: Path | None = None  # the first foreign entry, in sorted order
    why: str = ""  # what is foreign about it, when more than its name


def _kind(layout: Layout, name: str) -> tuple[bool, Layout | None]:
    """(declared, sub-layout) for `name`: sub-layout None means a file."""
    for pattern, sub in layout.items():
        if re.fullmatch(pattern, name):
            return True, sub
    killed = KILLED_WRITE.fullmatch(name)
    if killed and any(sub is None and re.fullmatch(p, killed["name"]) for p, sub in layout.items()):
        return True, None
    return False, None


def survey(root: Path, layout: Layout) -> Survey:
    """Walk `root` (a real directory, not a link) against `layout`; stops at the first entry in
    sorted order that twinrun does not write there."""
    found = Survey()
    _walk(root, layout, found)
    return found


def _walk(folder: Path, layout: Layout, found: Survey) -> bool:
    try:
        names = sorted(os.listdir(folder))
    except OSError as exc:
        raise OutputError(
            f"cannot read {folder} ({exc.strerror or exc})", "make it readable, or remove it"
        ) from exc
    for name in names:
        path = folder / name
        mode = os.lstat(path).st_mode  # lstat: a link is looked at, never through
        declared, sub = _kind(layout, name)
        if layout is ANY_TREE:
            if stat.S_ISDIR(mode) and not _walk(path, ANY_TREE, found):
                return False
            found.entries.append(path)
            continue
        if stat.S_ISLNK(mode):
            why = "a symbolic link; twinrun writes none and never follows one"
        elif not declared:
            why = ""
        elif sub is None and not stat.S_ISREG(mode):
            why = "a folder where twinrun writes a file" if stat.S_ISDIR(mode) else "not a file"
        elif sub is not None and not stat.S_ISDIR(mode):
            why = "a file where twinrun writes a folder"
        else:
            if sub is not None and not _walk(path, sub, found):
                return False
            found.entries.append(path)
            continue
        found.foreign, found.why = path, why
        return False
    return True


def remove(entries: list[Path]) -> None:
    """Remove surveyed entries (deepest first): files and links unlinked, folders rmdir'ed — a
    folder that gained an entry since the survey stays, with an OutputError naming it."""
    for path in entries:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise OutputError(
                f"cannot clear {path} ({exc.strerror or exc}); it changed while being cleared",
                "stop whatever else writes there, then rerun",
            ) from exc
