"""The house style as CI enforces it: `ruff check` and `ruff format --check` on src/ and tests/
(configured in pyproject.toml). A few seconds; the failure is ruff's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache", "src", "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"ruff {' '.join(command)} src tests:\n{proc.stdout}{proc.stderr}"
