"""What `reproduce` and `export` check before they trust a run directory's adapter.

A run directory is data someone handed over: its `adapter_model.safetensors` (and reward head)
must be the bytes the sidecar `twinrun.json` records (`adapter.sha256`, `reward_head.sha256`),
readable safetensors, float32 (the dtype twinrun writes), finite, and consistent with
`adapter_config.json` (each `lora_A` has `r` rows and each `lora_B` `r` columns; `r` and
`lora_alpha` equal the sidecar's `train.lora_rank` / `train.lora_alpha` when recorded). Any other
state is one line naming the file (exit 2), before anything is re-run or merged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError, IntegrityError

ADAPTER_FILE = "adapter_model.safetensors"
HEAD_FILE = "reward_head.safetensors"
HINT = "the run directory's adapter is damaged or was replaced: use the directory a run wrote"


def _tensors(path: Path, what: str) -> dict[str, Any]:
    import torch

    from twinrun.core import reading
    from twinrun.core.safetensors_io import read_tensors

    reading.open_regular(path, what, DataError).close()
    tensors = read_tensors(path, what, HINT, DataError)
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise DataError(f"{path}: {name} is stored as {t.dtype}, the run wrote float32", HINT)
        if not bool(torch.isfinite(t).all()):
            raise DataError(f"{path}: {name} holds a value that is not finite (NaN or Inf)", HINT)
    return tensors


def _pinned(path: Path, want: Any) -> None:
    from twinrun.core.digest import sha256_file

    if not path.is_file():
        raise DataError(f"{path} is missing (the sidecar records its sha256)", HINT)
    got = sha256_file(path)
    if isinstance(want, str) and got != want:
        raise IntegrityError(want, got, str(path), HINT)


def check_run_adapter(run_dir: str | Path, sidecar: dict[str, Any]) -> None:
    """DataError / IntegrityError / ModelError naming the file unless `run_dir`'s adapter (and
    reward head) are the recorded, finite, float32 bytes its adapter_config.json describes."""
    from twinrun.model.lora import read_adapter_config

    run = Path(run_dir)
    adapter = run / ADAPTER_FILE
    _pinned(adapter, (sidecar.get("adapter") or {}).get("sha256"))
    head = sidecar.get("reward_head")
    if isinstance(head, dict) and (head.get("sha256") or (run / HEAD_FILE).exists()):
        head_path = run / HEAD_FILE
        _pinned(head_path, head.get("sha256"))
        _tensors(head_path, "reward head")
    tensors = _tensors(adapter, "adapter weights")
    cfg = read_adapter_config(run)
    config = run / "adapter_config.json"
    recorded = sidecar.get("train")
    train: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    for key, field in (("r", "lora_rank"), ("lora_alpha", "lora_alpha")):
        want = train.get(field)
        if isinstance(want, int | float) and not isinstance(want, bool) and cfg[key] != want:
            raise DataError(f"{config}: {key} is {cfg[key]}, the run recorded {field} {want}", HINT)
    r = cfg["r"]
    for name, t in tensors.items():
        rows = t.shape[0] if t.dim() == 2 else None
        cols = t.shape[1] if t.dim() == 2 else None
        if ("lora_A" in name and rows != r) or ("lora_B" in name and cols != r):
            raise DataError(
                f"{config}: r is {r} but {adapter.name} holds {name} of shape {tuple(t.shape)}",
                HINT,
            )
