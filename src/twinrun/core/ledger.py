"""The list of what twinrun wrote into a run directory: `twinrun.files.jsonl`, a JSON line per
entry, appended (and fsynced) *before* the entry is created, so a run killed at any moment
still lists every file or folder it made. `--overwrite` removes only what the list names.

The list is the run directory's first file: `track(root)` creates it, and from then on every
write into `root` in this process — the atomic writes of `core.fileio`, the capture store, the
checkpoints, the appended logs — calls `note_written(path)`. What a listed entry covers:

- the entry itself; a listed folder covers everything inside it (a checkpoint, a capture's
  state folder);
- the leftover of a killed atomic write of a listed file (`.NAME.<random>.tmp` beside it) and
  of a listed folder (`.tmp-NAME-<random>` beside it, as checkpoints are written);
- the folders that lead to a listed entry (`checkpoints/`, `final/`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath

from twinrun.core.errors import OutputError, write_failed
from twinrun.core.jsonlimits import Limits, parse_json

LEDGER = "twinrun.files.jsonl"
LEDGER_FORMAT = "twinrun.files.v1"
MAX_LEDGER_BYTES = 16 * 2**20  # a run lists a few entries per checkpoint: far below this
KILLED_FILE = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp")
KILLED_FOLDER = re.compile(r"\.tmp-(?P<name>.+)-[A-Za-z0-9_]+")
# one line of the list: a flat object (a line nested deeper is not one twinrun wrote, and is
# refused as a DataError, a ValueError, instead of exhausting Python's recursion)
LINE_LIMITS = Limits(max_bytes=MAX_LEDGER_BYTES, max_file_bytes=MAX_LEDGER_BYTES, max_depth=4)

_TRACKED: dict[Path, set[str]] = {}  # real path of a run directory -> the entries it lists


def read_listed(root: Path) -> set[str] | None:
    """The entries `root`'s list names (relative POSIX paths), or None when it has no list, or
    one twinrun did not write (not a regular file, too large, a line that is not an entry). A
    last line cut short by a kill is left out."""
    path = root / LEDGER
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not os.path.isfile(path) or os.path.islink(path) or st.st_size > MAX_LEDGER_BYTES:
        return None
    with open(path, "rb") as fh:
        raw = fh.read(MAX_LEDGER_BYTES + 1)
    lines = raw.split(b"\n")
    lines = lines[:-1]  # what follows the last newline is a write cut short (or nothing)
    if not lines:
        return set()  # killed while it wrote its first line
    listed: set[str] = set()
    try:
        head = parse_json(lines[0], LEDGER, LINE_LIMITS)
        if not (isinstance(head, dict) and head.get("format") == LEDGER_FORMAT):
            return None
        for i, line in enumerate(lines[1:], start=1):
            try:
                entry = parse_json(line, LEDGER, LINE_LIMITS)
            except ValueError:
                if i < len(lines) - 1 and lines[i + 1].startswith(b"{"):
                    continue  # a line a kill cut short, ended by the next append's newline
                raise
            rel = entry.get("path") if isinstance(entry, dict) else None
            if not isinstance(rel, str) or not _plain(rel):
                return None
            listed.add(rel)
    except (ValueError, UnicodeDecodeError):
        return None
    return listed


def _plain(rel: str) -> bool:
    parts = PurePosixPath(rel).parts
    return bool(parts) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def covered(rel: str, listed: set[str]) -> bool:
    """Whether the entry `rel` of a run directory is one the list names (see the module's
    docstring); a folder leading to a listed entry is `leads_to`'s."""
    p = PurePosixPath(rel)
    if rel == LEDGER or rel in listed:
        return True
    for q in [p, *p.parents]:
        if str(q) == ".":
            break
        if q != p and str(q) in listed:
            return True
        for pattern in (KILLED_FILE, KILLED_FOLDER):
            m = pattern.fullmatch(q.name)
            if m and str(q.parent / m["name"]).removeprefix("./") in listed:
                return True
    return False


def leads_to(rel: str, listed: set[str]) -> bool:
    """Whether the folder `rel` lies on the way to a listed entry."""
    return any(PurePosixPath(rel) in PurePosixPath(entry).parents for entry in listed)


def _append(root: Path, record: dict[str, str]) -> None:
    path = root / LEDGER
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            size = os.fstat(fd).st_size
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"  # a line a kill cut short
            line = json.dumps(record, ensure_ascii=False) + "\n"
            os.write(fd, (("\n" if torn else "") + line).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_failed(path, exc) from exc


def track(root: Path, adopt: list[str] | None = None) -> None:
    """From now on, list in `root`'s `twinrun.files.jsonl` every entry this process writes
    there. The list is created when missing (listing `adopt`: the entries of an existing run
    being resumed) and continued when present."""
    real = Path(os.path.realpath(root))
    listed = read_listed(real)
    if listed is None:
        if os.path.lexists(real / LEDGER):
            raise OutputError(
                f"{root / LEDGER} is not a list twinrun wrote",
                "remove the run directory yourself, or choose another --output",
            )
        _append(real, {"format": LEDGER_FORMAT})
        listed = set()
        for rel in adopt or ():
            _append(real, {"path": rel})
            listed.add(rel)
    _TRACKED[real] = listed


def untrack(root: Path) -> None:
    _TRACKED.pop(Path(os.path.realpath(root)), None)


def note_written(path: str | os.PathLike[str], root: Path | None = None) -> None:
    """Before `path` is created: list it in the tracked run directory it lies in (or in
    `root`'s list, when given and `root` has one — a picture written beside a run's files).
    Nothing when `path` lies in no such directory or is listed already."""
    p = Path(path)
    real = Path(os.path.realpath(p.parent)) / p.name
    if root is not None:
        base = Path(os.path.realpath(root))
        listed = read_listed(base)
        rel = real.relative_to(base).as_posix() if base in real.parents else None
        if listed is not None and rel is not None and not covered(rel, listed):
            _append(base, {"path": rel})
        return
    for base, listed in list(_TRACKED.items()):
        if base not in real.parents:
            continue
        if not os.path.isfile(base / LEDGER):  # the directory was removed since: stop tracking
            _TRACKED.pop(base, None)
            continue
        rel = real.relative_to(base).as_posix()
        if not covered(rel, listed):
            _append(base, {"path": rel})
            listed.add(rel)
