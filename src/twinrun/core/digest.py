"""SHA256 helpers: streaming file and directory digests, canonical JSON (RFC 8785)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_files(paths: list[Path], root: Path) -> str:
    """One digest over several files: each framed by its path relative to `root` and its size."""
    h = hashlib.sha256()
    for p in sorted(paths):
        rel = p.relative_to(root).as_posix().encode()
        h.update(len(rel).to_bytes(8, "big") + rel)
        h.update(p.stat().st_size.to_bytes(8, "big"))
        with open(p, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
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
