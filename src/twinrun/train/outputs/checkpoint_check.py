"""Checkpoints that verify themselves before a resume trusts them.

Every checkpoint directory holds `checksums.json`: the SHA256 of every other file in it, written
last, before the directory is renamed into place. Reading a checkpoint (`read_verified`) checks,
before anything is restored or written:

- the set of files is exactly the one listed, and each file's SHA256 is the listed one (an edited
  `steps_done`, a flipped bit, a truncated tensor file);
- `state.json` parses, has the checkpoint format, and its `steps_done` is the directory's step;
- `state.safetensors` reads, holds exactly the expected keys (every parameter, every AdamW moment
  and step count `optim_keys` names, the generator state), each moment with its parameter's dtype
  and size, everything finite (a NaN planted in a moment), second moments and step counts
  non-negative, the generator state the size torch uses.

Any failure is `checkpoint step-N is corrupt (...)`. Resume then refuses, touching nothing, and
says which complete checkpoint comes before it: twinrun never falls back on its own, because a
corrupt checkpoint may mean a failing disk, and deleting the newest one is the user's decision.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from twinrun.core.digest import sha256_file
from twinrun.core.errors import DataError

CHECKSUMS = "checksums.json"
CHECKSUMS_FORMAT = "twinrun.checkpoint-checksums.v1"
HEX64 = re.compile(r"[0-9a-f]{64}")
RNG_KEY = "rng.torch_cpu"


def corrupt(path: Path, why: str) -> DataError:
    """`checkpoint step-N is corrupt (why)`, with what to do: the one before, or a restart."""
    before = sorted(
        p.name
        for p in path.parent.glob("step-*")
        if p.name < path.name and (p / CHECKSUMS).is_file()
    )
    hint = (
        f"delete {path} to resume from {before[-1]}, or restart the run with --overwrite"
        if before
        else "no complete checkpoint comes before it: restart the run with --overwrite"
    )
    return DataError(f"checkpoint {path.name} is corrupt ({why}) in {path.parent}", hint)


def write_checksums(directory: Path) -> None:
    """`checksums.json`: the SHA256 of every file already in `directory`."""
    sums = {p.name: sha256_file(p) for p in sorted(directory.iterdir()) if p.is_file()}
    body = {"format": CHECKSUMS_FORMAT, "sha256": sums}
    (directory / CHECKSUMS).write_text(json.dumps(body, sort_keys=True) + "\n")


def verify_checksums(path: Path) -> None:
    """Every file of checkpoint `path` is listed in its checksums.json with its SHA256."""
    from twinrun.core.jsonlimits import SMALL, load_json_file

    listing = path / CHECKSUMS
    if not listing.is_file():
        raise corrupt(path, f"it has no {CHECKSUMS}")
    try:
        body = load_json_file(listing, "checkpoint checksums", SMALL)
    except DataError as exc:
        raise corrupt(path, f"{CHECKSUMS} is unreadable: {exc.message}") from None
    sums = body.get("sha256") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or body.get("format") != CHECKSUMS_FORMAT
        or not isinstance(sums, dict)
        or not all(isinstance(v, str) and HEX64.fullmatch(v) for v in sums.values())
    ):
        raise corrupt(path, f"{CHECKSUMS} is not a {CHECKSUMS_FORMAT} listing")
    present = {p.name for p in path.iterdir()} - {CHECKSUMS}
    if present != set(sums):
        extra, missing = sorted(present - set(sums)), sorted(set(sums) - present)
        raise corrupt(path, f"files not listed {extra}, listed but missing {missing}")
    for name in sorted(sums):
        try:  # a FIFO or a link to /dev/zero in place of a file is refused, never read
            got = sha256_file(path / name)
        except DataError as exc:
            raise corrupt(path, exc.message.replace(str(path / name), name, 1)) from None
        except OSError as exc:
            raise corrupt(path, f"{name} cannot be read ({exc.strerror or exc})") from None
        if got != sums[name]:
            raise corrupt(path, f"{name}: Expected sha256 {sums[name]}  Got {got}")


def check_state(path: Path, state: Any, fmt: str) -> None:
    """The fields of state.json a resume relies on."""
    expected_step = int(path.name.removeprefix("step-")) if path.name[5:].isdigit() else None
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise corrupt(path, f"state.json is not a {fmt} record")
    steps = state.get("steps_done")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps != expected_step:
        raise corrupt(path, f"state.json steps_done {steps!r} is not the directory's step")
    for key, kind in (
        ("param_groups", list), ("optim_keys", dict), ("metrics", list), ("train", dict),
        ("param_names", list),
    ):  # fmt: skip
        if not isinstance(state.get(key), kind):
            raise corrupt(path, f"state.json has no {key}")


def check_tensors(path: Path, state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Expected keys, dtypes, sizes, finite values (see the module docstring)."""
    names: list[str] = state["param_names"]
    optim_keys: dict[str, list[str]] = state["optim_keys"]
    expected = {f"param.{n}" for n in names} | {RNG_KEY}
    for i, keys in optim_keys.items():
        if not (i.isdigit() and int(i) < len(names)) or not isinstance(keys, list):
            raise corrupt(path, f"state.json optim_keys names parameter {i!r}")
        expected |= {f"optim.{i}.{k}" for k in keys}
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or extra:
        raise corrupt(path, f"state.safetensors lacks {missing[:3]}, has unexpected {extra[:3]}")
    for name in names:
        t = tensors[f"param.{name}"]
        if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
            raise corrupt(path, f"parameter {name} is not finite {t.dtype}")
    for i, keys in optim_keys.items():
        ref = tensors[f"param.{names[int(i)]}"]
        for key in keys:
            t = tensors[f"optim.{i}.{key}"]
            if key == "step":
                ok = t.dtype == torch.float32 and t.numel() == 1
            else:
                ok = t.dtype == ref.dtype and t.numel() == ref.numel()
            if not ok:
                raise corrupt(path, f"optim.{i}.{key} is {t.dtype} {list(t.shape)}")
            if not bool(torch.isfinite(t).all()) or (key != "exp_avg" and bool((t < 0).any())):
                raise corrupt(path, f"optim.{i}.{key} holds a value that is not finite or < 0")
    rng = tensors[RNG_KEY]
    if rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        raise corrupt(path, f"{RNG_KEY} is {rng.dtype} {list(rng.shape)}")


def read_verified(path: Path, fmt: str, tensors_name: str, state_name: str) -> tuple[Any, Any]:
    """(state.json, tensors) of checkpoint `path`, every check above passed."""
    from twinrun.core.jsonlimits import RECORDS, load_json_file
    from twinrun.core.safetensors_io import read_safetensors

    verify_checksums(path)
    try:
        state = load_json_file(path / state_name, "checkpoint state", RECORDS)
    except DataError as exc:
        raise corrupt(path, exc.message) from None
    check_state(path, state, fmt)
    try:
        tensors = read_safetensors(path / tensors_name, "checkpoint state", "").tensors
    except DataError as exc:
        raise corrupt(path, exc.message) from None
    check_tensors(path, state, tensors)
    return state, tensors


def check_restorable(
    path: Path, state: dict[str, Any], tensors: dict[str, torch.Tensor], params: list[Any]
) -> None:
    """The checkpoint's parameters are the model's, in order, with the same shapes and dtypes."""
    if state["param_names"] != [name for name, _ in params]:
        raise corrupt(path, "its parameters are not this model's LoRA parameters")
    for name, p in params:
        t = tensors[f"param.{name}"]
        if t.shape != p.shape or t.dtype != p.dtype:
            raise corrupt(path, f"parameter {name} is {t.dtype} {list(t.shape)}")
