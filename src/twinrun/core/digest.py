"""SHA256 helpers: streaming file and directory digests, canonical JSON (RFC 8785)."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError
from twinrun.core.reading import _kind

CHUNK = 1 << 20


def open_hashed(path: str | os.PathLike[str]) -> io.BufferedReader:
    """`path` opened for hashing, refused (DataError, one line) unless it is a regular file: a
    FIFO would block the open forever and a link to /dev/zero would read without end. The open is
    non-blocking and the kind is checked on the open descriptor, so nothing swapped in between
    can hang it; a missing file is still FileNotFoundError."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    kind = _kind(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise DataError(f"{os.fspath(path)} is {kind}, not a file", "replace it with the file")
    return os.fdopen(fd, "rb")


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open_hashed(path) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_files(
    paths: list[Path], root: Path, taps: Mapping[Path, Callable[[bytes], None]] | None = None
) -> str:
    """One digest over several files: each framed by its path relative to `root` and its size.
    `taps`: a file's tap is given every chunk of it as it is hashed, in order (a second digest
    of the same bytes in the same pass: `model.shard_digests`)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        rel = p.relative_to(root).as_posix().encode()
        h.update(len(rel).to_bytes(8, "big") + rel)
        tap = (taps or {}).get(p)
        with open_hashed(p) as fh:
            h.update(os.fstat(fh.fileno()).st_size.to_bytes(8, "big"))
            while chunk := fh.read(CHUNK):
                h.update(chunk)
                if tap is not None:
                    tap(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> bytes:
    """RFC 8785 canonical bytes: what twinrun hashes whenever it hashes JSON."""
    import rfc8785

    return rfc8785.dumps(obj)


def sha256_json(obj: Any) -> str:
    return sha256_bytes(canonical_json(obj))


def sha256_dir(path: str | os.PathLike[str]) -> str:
    """One digest over every regular file under `path` (hidden files skipped)."""
    root = Path(path)
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    return sha256_files(files, root)
