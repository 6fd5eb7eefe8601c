"""Run directories: refuse to clobber, then write a run's artifacts atomically —
`adapter_model.safetensors`, `adapter_config.json`, `metrics.jsonl`, `twinrun.json`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from twinrun.core.errors import OutputError

SIDECAR = "twinrun.json"
SIDECAR_FORMAT = "twinrun.run.v1"
OURS = (
    SIDECAR, "metrics.jsonl", "diag.jsonl", "adapter_model.safetensors", "checkpoints",
    "twinrun.inputs.json",
)  # fmt: skip


def check_output_dir(path: str | Path, overwrite: bool) -> Path:
    """Refuse an existing non-empty directory unless `overwrite`; changes nothing on disk."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"--output {p} exists and is not a directory", "choose another path")
    if p.is_dir() and any(p.iterdir()):
        if not overwrite:
            raise OutputError(
                f"output directory {p} exists and is not empty",
                "choose a new --output, or pass --overwrite to replace it",
            )
        if not any((p / name).exists() for name in OURS):
            raise OutputError(
                f"--overwrite refused: {p} does not look like a twinrun run directory",
                "point --output at a new or twinrun-made directory",
            )
    return p


def begin_output_dir(p: Path, overwrite: bool) -> None:
    """Create (or, with --overwrite, empty) the run directory. Call after all validation."""
    if p.is_dir() and any(p.iterdir()) and overwrite:
        shutil.rmtree(p)
    p.mkdir(parents=True, exist_ok=True)


def command_line() -> list[str]:
    return (
        ["twinrun", *sys.argv[1:]]
        if sys.argv and sys.argv[0].endswith("twinrun")
        else list(sys.argv)
    )


def sidecar(
    *,
    train: dict[str, Any],
    model_sha256: str,
    data_sha256: str,
    adapter_sha256: str,
    determinism: dict[str, Any],
    runtime: dict[str, Any],
    metrics: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": SIDECAR_FORMAT,
        "train": train,
        "model": {"sha256": model_sha256},
        "data": {"sha256": data_sha256},
        "adapter": {"sha256": adapter_sha256},
        "determinism": determinism,
        "runtime": runtime,
        "metrics": metrics,
    }
    if extra:
        out.update(extra)
    return out
