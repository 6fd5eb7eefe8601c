"""A real tmpfs of a given size: a full disk on demand (skipped where mounting is not allowed)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_disk(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` mounted at `where` (made here), unmounted afterwards."""
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or res.returncode})")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
