"""What `reproduce` and `export` check before they trust a run directory's adapter.

A run directory is data someone handed over: its `adapter_model.safetensors` (and reward head)
must be the bytes the sidecar `twinrun.json` records (`adapter.sha256`, `reward_head.sha256`),
readable safetensors, float32 (the dtype twinrun writes), finite, and consistent with
`adapter_config.json` (each `lora_A` has `r` rows and each `lora_B` `r` columns; `r` and
`lora_alpha` equal the sidecar's `train.lora_rank` / `train.lora_alpha` when recorded). Any other
state is one line naming the file (exit 2), before anything is re-run or merged.

Without the sidecar that check is two parts: `check_adapter_files`, torch-free (the file, its
header, float32, the config and its rank), and `check_finite`, which reads the tensors. A training
run's `--init-adapter` goes through both: the first in the preflight, before torch loads
(`train.init_adapter.check_init_files`), the second before the model loads.
`read_adapter_config` reads an adapter_config.json, checked for the LoRA features twinrun
supports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError, IntegrityError, ModelError, TwinrunError
from twinrun.core.safetensors_io import TensorSpan
from twinrun.model.loading import ADAPTER_DIR_HINT, check_adapter_directory

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
HEAD_FILE = "reward_head.safetensors"
HINT = "the run directory's adapter is damaged or was replaced: use the directory a run wrote"


# the safetensors header's dtype names, as torch spells them (the rest as the header does)
DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def check_adapter_header(
    path: str | Path, what: str, hint: str = HINT, error: type[TwinrunError] = DataError
) -> dict[str, TensorSpan]:
    """The tensors of the adapter file `path`, from its header alone (no torch): `error(...)`
    naming the file unless it is a regular, readable safetensors file of float32 tensors."""
    from twinrun.core.safetensors_io import tensor_spans

    reading.open_regular(path, what, error).close()
    spans = tensor_spans(path, what, hint, error)
    for name, span in spans.items():
        if span.dtype != "F32":
            stored = DTYPE_NAMES.get(span.dtype, span.dtype)
            raise error(f"{path}: {name} is stored as {stored}, twinrun writes float32", hint)
    return spans


def check_finite(path: Path, what: str, hint: str, error: type[TwinrunError]) -> None:
    """`error(...)` naming the tensor unless every value of the safetensors file `path` is
    finite (it reads the tensors: torch)."""
    import torch

    from twinrun.core.safetensors_io import read_safetensors

    for name, t in read_safetensors(path, what, hint, error).tensors.items():
        if not bool(torch.isfinite(t).all()):
            raise error(f"{path}: {name} holds a value that is not finite (NaN or Inf)", hint)


def check_adapter_files(
    directory: str | Path,
    what: str,
    hint: str = HINT,
    error: type[TwinrunError] = DataError,
    recorded: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The adapter config of `directory` once its `adapter_model.safetensors` is a regular,
    readable safetensors file of float32 tensors and its adapter_config.json parses (ModelError
    otherwise) and has the tensors' rank (`lora_A` `r` rows, `lora_B` `r` columns); `error(...)`
    naming the file otherwise. `recorded`: a sidecar's `train` section, whose `lora_rank` /
    `lora_alpha` the config must equal where given. Headers and config alone: no torch."""
    run = Path(directory)
    adapter = run / ADAPTER_FILE
    spans = check_adapter_header(adapter, what, hint, error)
    cfg = read_adapter_config(run)
    config = run / ADAPTER_CONFIG
    for key, field in (("r", "lora_rank"), ("lora_alpha", "lora_alpha")):
        want = (recorded or {}).get(field)
        if isinstance(want, int | float) and not isinstance(want, bool) and cfg[key] != want:
            raise error(f"{config}: {key} is {cfg[key]}, the run recorded {field} {want}", hint)
    r = cfg["r"]
    for name, span in spans.items():
        rows = span.shape[0] if len(span.shape) == 2 else None
        cols = span.shape[1] if len(span.shape) == 2 else None
        if ("lora_A" in name and rows != r) or ("lora_B" in name and cols != r):
            raise error(
                f"{config}: r is {r} but {adapter.name} holds {name} of shape {span.shape}", hint
            )
    return cfg


def read_adapter_config(adapter_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """adapter_config.json, checked for the LoRA features twinrun supports."""
    root = Path(adapter_dir)
    path = root / ADAPTER_CONFIG
    hint = ADAPTER_DIR_HINT
    check_adapter_directory(root)
    if not path.is_file():
        raise ModelError(f"no {ADAPTER_CONFIG} in {root}", hint)
    try:
        cfg = json.loads(reading.read_text(path, "adapter config", 16 << 20, ModelError, hint))
    except ModelError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelError(f"cannot read {path}: {exc}", hint) from exc
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise ModelError(f"{path}: not a LoRA adapter config (peft_type != LORA)", hint)
    r, alpha, targets = cfg.get("r"), cfg.get("lora_alpha"), cfg.get("target_modules")
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        raise ModelError(f"{path}: r must be a positive integer, got {r!r}", hint)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ModelError(f"{path}: lora_alpha must be a positive number, got {alpha!r}", hint)
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise ModelError(f"{path}: target_modules must be a non-empty list of names", hint)
    unsupported = [
        key
        for key, ok in (
            ("use_dora", not cfg.get("use_dora")),
            ("bias", cfg.get("bias", "none") == "none"),
            ("modules_to_save", not cfg.get("modules_to_save")),
            ("fan_in_fan_out", not cfg.get("fan_in_fan_out")),
            ("rank_pattern", not cfg.get("rank_pattern")),
            ("alpha_pattern", not cfg.get("alpha_pattern")),
            ("layers_to_transform", cfg.get("layers_to_transform") is None),
            ("lora_bias", not cfg.get("lora_bias")),
        )
        if not ok
    ]
    if unsupported:
        raise ModelError(f"{path}: unsupported LoRA settings {unsupported}", "use plain LoRA")
    return cfg


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
    run = Path(run_dir)
    adapter = run / ADAPTER_FILE
    _pinned(adapter, (sidecar.get("adapter") or {}).get("sha256"))
    head = sidecar.get("reward_head")
    if isinstance(head, dict) and (head.get("sha256") or (run / HEAD_FILE).exists()):
        head_path = run / HEAD_FILE
        _pinned(head_path, head.get("sha256"))
        check_adapter_header(head_path, "reward head")
        check_finite(head_path, "reward head", HINT, DataError)
    recorded = sidecar.get("train")
    check_adapter_files(
        run, "adapter weights", recorded=recorded if isinstance(recorded, dict) else None
    )
    check_finite(adapter, "adapter weights", HINT, DataError)
