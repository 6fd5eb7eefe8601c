"""Complete checkpoints and bit-exact resume.

`--checkpoint-every N` writes `checkpoints/step-<K:06d>/` after every N-th optimizer step (K = steps
done): `state.safetensors` (every trainable parameter and the AdamW moments and step counts) and
`state.json` (steps done, metrics rows so far, the shaping numbers the run was started with, the
torch generator state, objective state such as the prioritized-replay buffer), and
`checksums.json` (the SHA256 of both, checked with everything else a resume trusts before it
trusts it: `train.checkpoint_check`). The directory is
built under a temporary name, every file fsynced, then renamed into place and the parent
fsynced: a checkpoint appears whole or not at all, and a kill mid-write leaves only a `.tmp-`
directory that resume ignores (and removes).

There is no data position or stream position to restore beyond the step: every draw is keyed
by (seed, purpose, step, ...), so step K's batch is the same whether the run got there directly
or through a resume.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from twinrun.core.determinism import runtime_versions
from twinrun.core.errors import ConfigError
from twinrun.core.fileio import fsync_dir
from twinrun.core.ledger import note_written
from twinrun.core.safetensors_io import write_tensors
from twinrun.train.outputs.checkpoint_check import (
    CHECKSUMS,
    check_restorable,
    read_verified,
    write_checksums,
)
from twinrun.train.outputs.run_dir import CHECKPOINTS, STATE_JSON, STATE_TENSORS
from twinrun.train.parallel.distributed import is_root
from twinrun.train.step.adamw import AdamW

FORMAT = "twinrun.checkpoint.v1"
# differences that may not change a byte of the result
RESUME_MAY_DIFFER = frozenset({"resume", "quiet", "overwrite", "prefetch", "checkpoint_every"})


@dataclass
class Checkpoint:
    path: Path
    steps_done: int
    state: dict[str, Any]
    tensors: dict[str, torch.Tensor]


def checkpoint_dir(out: Path, steps_done: int) -> Path:
    return out / CHECKPOINTS / f"step-{steps_done:06d}"


def write_checkpoint(
    out: Path,
    steps_done: int,
    params: list[tuple[str, torch.nn.Parameter]],
    optimizer: AdamW,
    state: dict[str, Any],
    rng_state: torch.Tensor | None = None,
) -> Path:
    """Write checkpoint `steps_done` atomically; returns its directory. `rng_state`: the torch
    CPU generator to record (default: as it is now). In a data-parallel run only rank 0
    writes (every process holds the same state); every process can read it back."""
    final = checkpoint_dir(out, steps_done)
    if not is_root():
        return final
    root = out / CHECKPOINTS
    note_written(final)  # listed before checkpoints/ or its temporary folder exists
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=root))
    try:
        tensors = {f"param.{name}": p.detach().cpu().contiguous() for name, p in params}
        opt = optimizer.state_dict()
        for i, s in opt["state"].items():
            for key, value in s.items():
                tensors[f"optim.{i}.{key}"] = value.detach().cpu().contiguous().reshape(-1)
        tensors["rng.torch_cpu"] = torch.get_rng_state() if rng_state is None else rng_state
        write_tensors(tmp / STATE_TENSORS, tensors, {"format": FORMAT})  # fsynced
        _crash_point("checkpoint-mid-write", steps_done)
        body = {
            "format": FORMAT,
            "steps_done": steps_done,
            "param_groups": opt["param_groups"],
            "optim_keys": {str(i): sorted(s) for i, s in opt["state"].items()},
            "param_names": [name for name, _ in params],
            "runtime": runtime_versions(),
            **state,
        }
        (tmp / STATE_JSON).write_text(json.dumps(body) + "\n")
        write_checksums(tmp)
        for name in (STATE_JSON, CHECKSUMS):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _crash_point(name: str, steps_done: int) -> None:
    """Test hook: `TWINRUN_CRASH_AT=checkpoint-mid-write:K` kills the process with SIGKILL
    in the middle of writing checkpoint K — the real thing, not a simulation of it."""
    if os.environ.get("TWINRUN_CRASH_AT") == f"{name}:{steps_done}":
        os.kill(os.getpid(), signal.SIGKILL)


def newest_checkpoint(out: Path) -> Checkpoint | None:
    """The newest complete checkpoint, verified (`checkpoint_check`: DataError "checkpoint
    step-N is corrupt" otherwise); temporary leftovers of a killed write are removed."""
    root = out / CHECKPOINTS
    if not root.is_dir():
        return None
    for leftover in root.glob(".tmp-*") if is_root() else ():
        shutil.rmtree(leftover, ignore_errors=True)
    done = sorted(p for p in root.glob("step-*") if (p / STATE_JSON).is_file())
    if not done:
        return None
    return read_checkpoint(done[-1])


def read_checkpoint(path: Path) -> Checkpoint:
    """Checkpoint `path`, every file checked against its checksums and the state validated;
    touches nothing."""
    state, tensors = read_verified(path, FORMAT, STATE_TENSORS, STATE_JSON)
    return Checkpoint(path, int(state["steps_done"]), state, tensors)


def resume_point(out: Path) -> int:
    """Steps done by the newest complete checkpoint of `out` (an error when there is none)."""
    ckpt = newest_checkpoint(out)
    if ckpt is None:
        raise ConfigError(
            f"--resume: {out} has no complete checkpoint",
            "start the run without --resume (and with --checkpoint-every to make checkpoints)",
        )
    return ckpt.steps_done


def check_same_run(recorded: dict[str, Any], current: dict[str, Any]) -> None:
    """--resume refuses flags that differ from what the run recorded."""
    keys = sorted((set(recorded) | set(current)) - RESUME_MAY_DIFFER)
    differ = [k for k in keys if recorded.get(k) != current.get(k)]
    if differ:
        detail = ", ".join(f"{k}: {recorded.get(k)!r} -> {current.get(k)!r}" for k in differ)
        raise ConfigError(
            f"--resume with flags that differ from the recorded run ({detail})",
            "resume with the flags the run was started with",
        )


def restore(
    ckpt: Checkpoint,
    params: list[tuple[str, torch.nn.Parameter]],
    optimizer: AdamW,
) -> None:
    """Put parameters, AdamW state and the torch generator back exactly as they were (checked
    against the model's parameters before anything is changed)."""
    check_restorable(ckpt.path, ckpt.state, ckpt.tensors, params)
    with torch.no_grad():
        for name, p in params:
            p.copy_(ckpt.tensors[f"param.{name}"])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for i, keys in ckpt.state["optim_keys"].items():
        state[int(i)] = {}
        for key in keys:
            t = ckpt.tensors[f"optim.{i}.{key}"]
            ref = params[int(i)][1]
            state[int(i)][key] = t if key == "step" else t.reshape(ref.shape).to(ref.device)
        if "step" in state[int(i)]:
            state[int(i)]["step"] = state[int(i)]["step"].reshape(())
    optimizer.load_state_dict({"state": state, "param_groups": ckpt.state["param_groups"]})
    torch.set_rng_state(ckpt.tensors["rng.torch_cpu"])
