"""Reading a Hugging Face checkpoint directory without building a model (no torch).

`read_model_config(dir)` returns config.json (ModelError when the directory or file is missing,
unreadable, or has no `model_type`); `weight_files(dir)` lists its *.safetensors (ModelError when
there are none, with a conversion hint when only pickle files are there). Whether transformers
knows the architecture as a causal LM is checked when the model is built (`model.build`).
"""

from __future__ import annotations

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
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import SMALL, load_json_file

    try:
        cfg = load_json_file(cfg_path, "model config", SMALL)
    except DataError as exc:
        raise ModelError(f"cannot read {exc.message}", hint) from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        raise ModelError(f"{cfg_path}: no model_type", hint)
    check_sizes(cfg, cfg_path)
    return cfg


SIZE_KEYS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim",
)  # fmt: skip


def check_sizes(cfg: dict[str, Any], cfg_path: Path) -> None:
    """Every size the model is built from must be a positive integer (not "64", not 64.0)."""
    bad = [
        key
        for key in SIZE_KEYS
        if key in cfg
        and cfg[key] is not None
        and (isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1)
    ]
    if bad:
        raise ModelError(
            f"{cfg_path}: {', '.join(bad)} must be positive integers",
            "fix config.json (numbers without quotes) or re-save the checkpoint",
        )


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
