"""The runs `twinrun check` plans (one subprocess each) and what each one returned."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlannedRun:
    """One subprocess of the plan: `label` is "seed-S-a", "seed-S-b" or "seed-T"."""

    label: str
    seed: int
    out: Path
    argv: tuple[str, ...]


@dataclass(frozen=True)
class RunResult:
    run: PlannedRun
    returncode: int
    wall_s: float
    stdout_log: Path
    stderr_log: Path
