"""The house style as CI enforces it: `ruff check` and `ruff format --check` on src/, tests/,
testkit/ and bench/ (configured in pyproject.toml). A few seconds; the failure is ruff's own
report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src", "tests", "testkit", "bench")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", *FOLDERS],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = f"ruff {' '.join(command)} {' '.join(FOLDERS)}"
    assert proc.returncode == 0, f"{said}:\n{proc.stdout}{proc.stderr}"
