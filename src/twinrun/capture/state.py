"""Trainable state as bytes: the adapter, the reward head and the AdamW state, each serialized
exactly as the files twinrun writes, so a SHA256 of these bytes is the SHA256 of the file.

The trainer state (`trainer_state.json`, format `twinrun.trainer-state.v1`) says which optimizer
step a resume state follows: `"step": -1` for an initialization state (`twinrun init-adapter`).

The AdamW state file (`optimizer.safetensors`, format `twinrun.adamw-state.v1`) holds, for the
i-th trainable parameter, `<i>.step`, `<i>.exp_avg` and `<i>.exp_avg_sq` as torch keeps them,
and the parameter names in order in its metadata; loading refuses a different parameter list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from twinrun.core.errors import DataError, ModelError
from twinrun.core.jsonlimits import SMALL, load_json_file
from twinrun.core.safetensors_io import read_safetensors, tensors_bytes
from twinrun.model.output import ModuleTree

OPTIMIZER_FORMAT = "twinrun.adamw-state.v1"
HEAD_PARAM = "reward_head.score.weight"
TRAINER_STATE = "trainer_state.json"
STATE_FORMAT = "twinrun.trainer-state.v1"


class HasAdamState(Protocol):
    """An optimizer whose per-parameter state is a dict of tensors (`exp_avg`, ...), as torch's
    AdamW and twinrun's `train.adamw.AdamW` keep it."""

    state: dict[Any, dict[str, Any]]


def adapter_bytes(model: ModuleTree) -> bytes:
    """What `save_adapter` writes as adapter_model.safetensors for this model, now."""
    from twinrun.model.lora import ADAPTER_METADATA, lora_state_dict

    return tensors_bytes(lora_state_dict(model), ADAPTER_METADATA)


def head_bytes(weight: torch.Tensor) -> bytes:
    """What `save_reward_head` writes for this head weight."""
    from twinrun.model.reward_head import HEAD_METADATA, head_tensors

    return tensors_bytes(head_tensors(weight), HEAD_METADATA)


def optimizer_bytes(params: list[tuple[str, torch.nn.Parameter]], optimizer: HasAdamState) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    for i, (_, p) in enumerate(params):
        for key, value in optimizer.state.get(p, {}).items():
            tensors[f"{i}.{key}"] = value.detach().cpu().contiguous().clone()
    from twinrun.capture.payload import pack_meta

    names = [name for name, _ in params]
    return tensors_bytes(tensors, pack_meta({"format": OPTIMIZER_FORMAT, "params": names}))


def load_optimizer_state(
    data: bytes,
    params: list[tuple[str, torch.nn.Parameter]],
    optimizer: HasAdamState,
    where: str,
) -> None:
    """Put a saved AdamW state into a fresh optimizer over the same parameters."""
    from twinrun.capture.payload import unpack_meta

    meta: dict[str, Any] = unpack_meta(data)
    names = [name for name, _ in params]
    if meta.get("format") != OPTIMIZER_FORMAT or meta.get("params") != names:
        raise DataError(f"{where}: not an AdamW state for these parameters", "re-capture")
    tensors = read_safetensors(data, "AdamW state", "re-capture", where=where).tensors
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        per_param.setdefault(int(index), {})[name] = value
    for i, (_, p) in enumerate(params):
        if i in per_param:
            optimizer.state[p] = {
                k: v.to(p.device) if k != "step" else v for k, v in per_param[i].items()
            }


def read_trainer_state(adapter_dir: str | Path) -> dict[str, Any]:
    """trainer_state.json of a resume state; a ModelError when missing or malformed."""
    path = Path(adapter_dir) / TRAINER_STATE
    hint = "create the initial state with `twinrun init-adapter`"
    if not path.is_file():
        raise ModelError(f"{path} not found: {adapter_dir} is not a resume state", hint)
    try:
        state = load_json_file(path, "trainer state", SMALL)
    except DataError as exc:
        raise ModelError(exc.message, hint) from None
    step = state.get("step") if isinstance(state, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < -1:
        raise ModelError(f"{path}: 'step' must be an integer >= -1, got {step!r}", hint)
    return state
