"""The architecture as CI enforces it: the import layers and cycles (import-linter, configured in
pyproject.toml), a clean type check of src/ (mypy), and no unexplained `# type: ignore`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


def test_import_contracts_hold() -> None:
    proc = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout
