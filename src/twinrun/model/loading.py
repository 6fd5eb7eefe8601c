"""Reading a Hugging Face checkpoint directory without building a model (no torch).

`read_model_config(dir)` returns config.json (ModelError when the directory or file is missing,
unreadable, or has no `model_type`); `weight_files(dir)` lists its *.safetensors (ModelError when
there are none, with a conversion hint when only pickle files are there). Whether transformers
knows the architecture as a causal LM is checked when the model is built (`model.build`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinrun.core.errors import ModelError


def read_model_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a checkpoint directory; ModelError when missing or unreadable."""
    root = Path(model_dir)
    hint = "point --model at a local Hugging Face checkpoint (or run `twinrun toy-model`)"
    if not root.is_dir():
        raise ModelError(f"model directory {root} does not exist", hint)
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise ModelError(f"no config.json in {root}", hint)
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read {cfg_path}: {exc}", hint) from exc
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        raise ModelError(f"{cfg_path}: no model_type", hint)
    return cfg


def weight_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint's *.safetensors files (sorted), adapter files excluded."""
    root = Path(model_dir)
    files = sorted(p for p in root.glob("*.safetensors") if not p.name.startswith("adapter_"))
    if not files:
        if any(root.glob("*.bin")) or any(root.glob("*.pt")):
            raise ModelError(
                f"{root} holds pickle weights only (pytorch_model.bin), which twinrun never loads",
                "convert once: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR)"
                " writes model.safetensors",
            )
        raise ModelError(
            f"no safetensors weights in {root}", "save the checkpoint with save_pretrained"
        )
    return files
