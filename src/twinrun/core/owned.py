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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from twinrun.core.errors import OutputError

# a regular expression (matched against the whole name) -> None for a file, or the folder's layout
Layout = Mapping[str, "Layout | None"]
KILLED_WRITE = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")


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


def declared(layout: Layout, name: str) -> bool:
    """Whether twinrun writes an entry called `name` where `layout` applies."""
    return _kind(layout, name)[0]


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


# -- one rule for every output ----------------------------------------------------------------
# Every command that writes claims its output here first, before it reads an input or loads a
# model: an existing output is refused without --overwrite; with it, only what that command
# itself wrote is replaced (a file that says so inside, a directory whose manifest lists every
# entry); and an output that is one of the command's inputs, lies inside one or holds one is
# refused whatever the flags.


def _real(p: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(p))


def refuse_input_overlap(
    out: str | os.PathLike[str],
    inputs: Mapping[str, str | os.PathLike[str] | None],
    what: str = "--output",
    allowed_names: tuple[str, ...] = (),
) -> None:
    """OutputError when `out` is one of `inputs` (name -> path), lies inside one, or holds one.
    `allowed_names`: file names the command writes into an input run directory by design (a
    picture beside the run's own files), which no input ever is."""
    o = _real(out)
    for name, given in inputs.items():
        if given is None:
            continue
        i = _real(given)
        if o == i:
            raise OutputError(
                f"{what} {out} is the {name} itself; writing it would destroy what is read",
                f"choose an {what} outside {given}",
            )
        if i in o.parents and not (o.parent == i and o.name in allowed_names):
            raise OutputError(
                f"{what} {out} lies inside the {name} {given}; writing it could replace what "
                "is read",
                f"choose an {what} outside {given}",
            )
        if o in i.parents:
            raise OutputError(
                f"{what} {out} holds the {name} {given}; replacing it would remove what is read",
                f"choose an {what} that does not contain {given}",
            )


def claim_file(
    output: str | os.PathLike[str],
    overwrite: bool,
    writer: str,
    is_ours: Callable[[Path], bool],
    inputs: Mapping[str, str | os.PathLike[str] | None] | None = None,
    what: str = "--output",
    allowed_names: tuple[str, ...] = (),
) -> Path:
    """A file output of `writer` (e.g. "twinrun plot"), checked before any work: not a link, a
    directory or in an unwritable place (`core.paths.output_file`), not an input; an existing
    one only with `overwrite`, and only when `is_ours(path)` says `writer` wrote it. Changes
    nothing on disk; returns the absolute path."""
    from twinrun.core.paths import output_file

    p = output_file(output, True, what)
    refuse_input_overlap(p, inputs or {}, what, allowed_names)  # first: whatever the flags
    if os.path.lexists(p) and not overwrite:
        raise OutputError(f"{output} exists", f"choose another {what} or pass --overwrite")
    if os.path.lexists(p):
        if not stat.S_ISREG(os.lstat(p).st_mode):
            raise OutputError(
                f"{what} {output} exists and is not a regular file", "choose a new path"
            )
        if not is_ours(p):
            raise OutputError(
                f"--overwrite refused: {output} was not written by {writer}",
                f"choose a new {what}; --overwrite replaces only a file {writer} wrote",
            )
    return p


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def png_signed(software: str) -> Callable[[Path], bool]:
    """`is_ours` for a PNG whose tEXt chunk says Software = `software` (matplotlib writes the
    text chunks before the image data, so the first 4 KiB hold it)."""
    mark = b"tEXtSoftware\x00" + software.encode()

    def check(path: Path) -> bool:
        head = _head(path, 4096)
        return head.startswith(b"\x89PNG\r\n\x1a\n") and mark in head

    return check


def json_format(*formats: str) -> Callable[[Path], bool]:
    """`is_ours` for a JSON object file whose "format" is one of `formats`."""

    def check(path: Path) -> bool:
        from twinrun.core.errors import TwinrunError
        from twinrun.core.jsonlimits import load_json_file

        try:
            doc = load_json_file(path, "earlier output")
        except TwinrunError:
            return False
        return isinstance(doc, dict) and doc.get("format") in formats

    return check


# -- directories a manifest lists ---------------------------------------------------------------


def manifest_entries(root: Path, listed: Mapping[str, str], manifest_name: str) -> list[Path]:
    """Every entry of the existing directory `root`, deepest first, when it holds exactly the
    files `listed` (relative path -> SHA256) with those bytes, their folders and `manifest_name`;
    OutputError naming the first entry that is not, before anything is removed."""
    from twinrun.core.digest import sha256_file

    folders = {str(Path(rel).parent) for rel in listed} - {"."}
    folders |= {str(q) for rel in folders for q in Path(rel).parents if str(q) != "."}
    entries: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        here = Path(dirpath)
        for name in sorted(filenames + dirnames):
            path = here / name
            rel = path.relative_to(root).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode) and not stat.S_ISLNK(mode) and rel in folders:
                entries.append(path)
                continue
            ok = stat.S_ISREG(mode) and (
                rel == manifest_name or (rel in listed and sha256_file(path) == listed[rel])
            )
            if not ok:
                why = (
                    "changed since it was written"
                    if rel in listed and stat.S_ISREG(mode)
                    else "which the earlier output's manifest does not list"
                )
                raise OutputError(
                    f"--overwrite refused: {root} holds {rel}, {why}",
                    "move it out of the directory, or choose another --output; --overwrite "
                    "removes only the files twinrun wrote there",
                )
            entries.append(path)
    return entries
