"""`twinrun init-adapter`: the initialization resume state a capture starts from.

It writes the LoRA adapter a fresh run at this seed would start with (`apply_lora`: A from
`stream(seed, "lora_A", module)`, B zero) in PEFT's format, and `trainer_state.json` with
`"step": -1` — no optimizer step has run. A v1 capture accepts only such a state: the trainer
then runs logical step 0 exactly once.

A run that starts from such a directory (`--init-adapter`) checks it first, as `reproduce` and
`export` check a run's adapter (`model.adapter_check`): `check_init_files` in the preflight,
before torch loads (a regular, readable safetensors file of float32 tensors, an
adapter_config.json that parses and has their rank, and the run's rank and alpha), and
`check_init_weights` before the model is built (every weight finite). Each refusal is one line
naming the file, before anything is written.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from twinrun.capture.manifest import REQUIRED_STATE, STATE_FILES
from twinrun.core.errors import ConfigError, ModelError
from twinrun.core.fileio import atomic_write_json
from twinrun.core.owned import Layout

INIT_HINT = "write it again with `twinrun init-adapter`, or give an adapter a run wrote"
INIT_WHAT = "initial adapter weights"

# what it writes: the adapter, its config and trainer_state.json (the state a replay reads)
INIT_LAYOUT: Layout = {re.escape(STATE_FILES[key]): None for key in REQUIRED_STATE}


def init_adapter(
    out: str | Path,
    model: str,
    seed: int,
    rank: int,
    alpha: float,
    targets: str | tuple[str, ...] | None = None,
) -> Path:
    """Write the initial adapter and trainer_state.json into the new directory `out` (`targets`:
    None for the architecture's default LoRA targets, "all-linear", or module names). Every
    argument is checked before torch loads."""
    problems = []
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        problems.append(f"--seed must be in [0, 2**63), got {seed!r}")
    if not isinstance(rank, int) or rank < 1:
        problems.append(f"--lora-rank must be >= 1, got {rank!r}")
    if not alpha > 0:
        problems.append(f"--lora-alpha must be > 0, got {alpha!r}")
    if problems:
        raise ConfigError("; ".join(problems))
    from twinrun.core.paths import output_path

    path = Path(out)
    output_path(path, "init-adapter directory")  # a link, under a file, unwritable: refused
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(f"{path} exists and is not empty", "choose a new directory")
    from twinrun.model.loading import read_model_config

    read_model_config(model)  # a missing or incomplete checkpoint: one line, no torch yet
    from twinrun.model.build import FreshLora, build_model

    base = build_model(
        model, precision="f32", device="cpu", lora=FreshLora(rank, alpha, seed, targets)
    )
    made = not path.exists()
    try:
        _write(path, base, model, seed, rank, alpha)
    except BaseException:  # a full disk, a kill: leave no half-made directory behind
        if made:
            shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def _write(path: Path, base: Any, model: str, seed: int, rank: int, alpha: float) -> None:
    from twinrun.capture.state import STATE_FORMAT, TRAINER_STATE
    from twinrun.core.digest import sha256_file
    from twinrun.model.loading import model_sha256
    from twinrun.model.lora import save_adapter

    save_adapter(base, path, base_model_path=str(model), rank=rank, alpha=alpha)
    atomic_write_json(
        path / TRAINER_STATE,
        {
            "format": STATE_FORMAT,
            "step": -1,
            "seed": seed,
            "lora_rank": rank,
            "lora_alpha": alpha,
            "model_sha256": model_sha256(model),
            "adapter_sha256": sha256_file(path / "adapter_model.safetensors"),
        },
    )


def check_init_files(directory: str | Path, rank: int, alpha: float) -> None:
    """ModelError naming the file unless `directory`'s adapter weights are a regular, readable
    safetensors file of float32 tensors and its adapter_config.json a plain LoRA config of their
    rank (`check_adapter_files`: headers and config alone, no torch); ConfigError unless the
    adapter is of the run's `rank` and `alpha`. The preflight runs it, before torch loads."""
    from twinrun.model.adapter_check import check_adapter_files
    from twinrun.model.loading import check_adapter_directory

    check_adapter_directory(Path(directory))
    adapter = check_adapter_files(directory, INIT_WHAT, INIT_HINT, ModelError)
    if adapter["r"] != rank or float(adapter["lora_alpha"]) != alpha:
        raise ConfigError(
            f"adapter {directory} has rank {adapter['r']} alpha {adapter['lora_alpha']}, the "
            f"run asks for rank {rank} alpha {alpha}",
            "make the LoRA flags match the adapter",
        )


def check_init_weights(directory: str | Path) -> None:
    """ModelError naming the tensor unless every weight of `directory`'s adapter is finite (it
    reads them: the session runs it, before the model loads)."""
    from twinrun.model.adapter_check import ADAPTER_FILE, check_finite

    check_finite(Path(directory) / ADAPTER_FILE, INIT_WHAT, INIT_HINT, ModelError)
