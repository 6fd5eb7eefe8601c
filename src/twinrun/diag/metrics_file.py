"""Reading a run's `metrics.jsonl`: one JSON object per line, bounded like a diag file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError


def read_metrics(
    run_dir: str | os.PathLike[str], hint: str = "does the command honour {out}?"
) -> list[dict[str, Any]]:
    """The rows of `run_dir/metrics.jsonl` (blank lines skipped). DataError (exit 2) when the
    file is missing, empty or has a line that is not a JSON object."""
    from twinrun.core.jsonlimits import DIAG, iter_jsonl

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: the run wrote no metrics.jsonl", hint)
    rows: list[dict[str, Any]] = []
    for lineno, obj in iter_jsonl(path, "metrics file", DIAG):
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: a metrics row must be a JSON object")
        rows.append(obj)
    if not rows:
        raise DataError(f"{path}: the run wrote no metrics rows", "did it train at all?")
    return rows
