"""A working directory laid out like the repository root, for running the examples and the
docs' commands as a user would: `runs/toy` (the session's toy checkpoint), `examples/` and
`src/twinrun/examples/` (links to the real folders)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def lay_out(root: Path, toy: Path | None) -> Path:
    (root / "src" / "twinrun").mkdir(parents=True)
    (root / "src" / "twinrun" / "examples").symlink_to(REPO / "src" / "twinrun" / "examples")
    (root / "examples").symlink_to(REPO / "examples")
    (root / "runs").mkdir()
    if toy is not None:
        (root / "runs" / "toy").symlink_to(toy)
    return root


@pytest.fixture()
def repo_like(tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp dir laid out like the repository root, with the toy model at runs/toy; cwd."""
    root = lay_out(tmp_path / "repo", toy_model_dir)
    monkeypatch.chdir(root)
    return root
