"""The capture manifest: the JSON file that pins a capture, and the names of its files.

For step K a capture is `optimizer_batch_step_<K:06d>.safetensors` (the payload) and
`optimizer_batch_step_<K:06d>.manifest.json`; a capture of a step inside a longer run also has
`optimizer_batch_step_<K:06d>.state/` (the adapter and AdamW state right before step K: a resume
state with `trainer_state.json` step K-1) and, once the step is done, `.final/` (the adapter right
after it). The manifest is written last: it is the commit marker.

The manifest pins by SHA256 the payload, the logical batch, the redacted resolved config, the
optimizer contract, and the initial adapter weight file (plus the AdamW state and reward head
when the step starts from them), and records runtime versions and the step's learning rate.
Replay hashes the manifest file against its external pin *before* `parse` sees a byte of it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from twinrun.capture.payload import FORMAT
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import SMALL, parse_json
from twinrun.objectives.registry import NAMES

HEX64 = re.compile(r"^[0-9a-f]{64}$")
STATE_FILES = {  # every file of the initial state a replay reads, each pinned by SHA256
    "adapter": "adapter_model.safetensors",
    "adapter_config": "adapter_config.json",  # rank, alpha, use_rslora, targets
    "trainer_state": "trainer_state.json",
    "optimizer": "optimizer.safetensors",
    "reward_head": "reward_head.safetensors",
}
REQUIRED_STATE = ("adapter", "adapter_config", "trainer_state")


def stem(step: int) -> str:
    return f"optimizer_batch_step_{step:06d}"


def payload_name(step: int) -> str:
    return f"{stem(step)}.safetensors"


def manifest_name(step: int) -> str:
    return f"{stem(step)}.manifest.json"


def state_dir_name(step: int) -> str:
    return f"{stem(step)}.state"


def final_dir_name(step: int) -> str:
    return f"{stem(step)}.final"


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and bool(HEX64.match(value))


def dumps(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def member(folder: Path, name: Any, what: str) -> Path:
    """A file named by the manifest, which must be a plain name inside the manifest's folder."""
    if not isinstance(name, str) or not name:
        raise DataError(f"manifest {what} file name is missing", "re-capture the step")
    pure = PurePosixPath(name)
    if (
        pure.is_absolute()
        or "\\" in name
        or len(pure.parts) != 1
        or pure.name in (".", "..")
        or name != pure.name
    ):
        raise DataError(
            f"manifest {what} file {name!r} escapes the capture folder",
            "a capture names only files beside its manifest",
        )
    return folder / name


def _schedule_problems(schedule: Any, step: Any) -> list[str]:
    """The malformed field of a manifest's `schedule` (its `lr`, then its `total_steps`, which
    must lie past the manifest's step), if any."""
    if not isinstance(schedule, dict) or not isinstance(schedule.get("lr"), float | int):
        return ["schedule.lr"]
    if not isinstance(schedule.get("total_steps"), int) or (
        isinstance(step, int) and schedule["total_steps"] <= step
    ):
        return ["schedule.total_steps"]
    return []


def _initial_state_problems(initial: Any) -> list[str]:
    """The malformed fields of a manifest's `initial_state`: its resume step, else each state
    file's pin that is required or given but not a SHA256 pin."""
    if not isinstance(initial, dict) or not isinstance(initial.get("resume_step"), int):
        return ["initial_state.resume_step"]
    problems = []
    for key in STATE_FILES:
        pin = initial.get(key)
        if (key in REQUIRED_STATE or pin is not None) and (
            not isinstance(pin, dict) or not is_sha256(pin.get("sha256"))
        ):
            problems.append(f"initial_state.{key}.sha256")
    return problems


def _field_problems(m: dict[str, Any]) -> list[str]:
    """Every field of a manifest that is missing or malformed, in the manifest's field order."""
    problems = []
    if m.get("objective") not in NAMES:
        problems.append(f"objective {m.get('objective')!r}")
    step = m.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problems.append("step")
    for key in ("logical_batch_sha256", "effective_rows_sha256"):
        if not is_sha256(m.get(key)):
            problems.append(key)
    for key in ("payload", "config", "optimizer_contract"):
        if not isinstance(m.get(key), dict) or not is_sha256(m[key].get("sha256")):
            problems.append(f"{key}.sha256")
    if not isinstance(m.get("optimizer_contract", {}).get("values"), dict):
        problems.append("optimizer_contract.values")
    problems += _schedule_problems(m.get("schedule"), step)
    problems += _initial_state_problems(m.get("initial_state"))
    return problems


def parse(data: bytes, where: str) -> dict[str, Any]:
    """Parse and validate manifest bytes (already checked against their pin)."""
    hint = "re-capture the step"
    m = parse_json(data, f"{where}: manifest", SMALL)
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DataError(f"{where}: not a {FORMAT} manifest", hint)
    problems = _field_problems(m)
    if problems:
        raise DataError(f"{where}: manifest fields missing or malformed: {problems}", hint)
    return m
