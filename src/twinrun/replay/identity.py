"""Each replay's own identity: a random run id (`os.urandom`), its start time and process id,
in `twinrun.run-id.json` — a file of its own, apart from every output two replays are compared
by (their rows, digests and adapters are meant to be equal). `twinrun evidence` counts a replay
as fresh only when its run id differs from every other replay's, so a replay directory copied
under a new name is refused, by name, instead of passing as a second replay."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from twinrun.core.fileio import atomic_write_json

RUN_IDENTITY = "twinrun.run-id.json"
FORMAT = "twinrun.run-id.v1"


def new_identity() -> dict[str, Any]:
    """A fresh identity: 128 random bits, the UTC start time, this process's id."""
    return {
        "format": FORMAT,
        "run_id": os.urandom(16).hex(),
        "started_at": datetime.now(tz=UTC).isoformat(timespec="microseconds"),
        "pid": os.getpid(),
    }


def write_identity(out: Path) -> dict[str, Any]:
    identity = new_identity()
    atomic_write_json(out / RUN_IDENTITY, identity)
    return identity


def read_identity(run_dir: Path) -> dict[str, Any] | None:
    """The run's identity, or None when it has none (or an unreadable one)."""
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import SMALL, load_json_file

    file = run_dir / RUN_IDENTITY
    if not file.is_file():
        return None
    try:
        identity = load_json_file(file, "run identity", SMALL)
    except DataError:
        return None
    if not isinstance(identity, dict) or not isinstance(identity.get("run_id"), str):
        return None
    return identity
