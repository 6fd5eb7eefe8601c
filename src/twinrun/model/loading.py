"""Reading a Hugging Face Llama checkpoint directory without building a model (no torch).

`read_model_config(dir)` returns config.json (ModelError when the directory or file is missing
or `model_type` is not llama); `weight_files(dir)` lists its *.safetensors (ModelError when
there are none); `LlamaSpec.from_config(cfg)` extracts and checks the architecture numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.core.errors import ModelError


@dataclass(frozen=True)
class LlamaSpec:
    """The architecture numbers read from a checkpoint's config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: dict[str, Any] = field(default_factory=dict)
    max_position_embeddings: int = 2048
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any], where: str = "config.json") -> LlamaSpec:
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
            rope.setdefault("rope_theta", float(cfg.get("rope_theta", 10000.0)))
            rope["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
            spec = cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope=rope,
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(
                f"{where}: bad or missing Llama setting {exc}", "check config.json"
            ) from exc
        if cfg.get("hidden_act", "silu") != "silu":
            raise ModelError(
                f"{where}: hidden_act {cfg.get('hidden_act')!r} is not supported",
                "twinrun's Llama supports silu only",
            )
        if spec.num_heads % spec.num_kv_heads:
            raise ModelError(
                f"{where}: num_attention_heads is not a multiple of num_key_value_heads",
                "check config.json",
            )
        if spec.rope["rope_type"] not in ("default", "linear", "llama3"):
            raise ModelError(
                f"{where}: rope_type {spec.rope['rope_type']!r} is not supported",
                "supported rope types: default, linear, llama3",
            )
        return spec


def read_model_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a Llama checkpoint directory; ModelError when missing or not llama."""
    root = Path(model_dir)
    hint = "point --model at a local Hugging Face Llama checkpoint (or run `twinrun toy-model`)"
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
    if not isinstance(cfg, dict) or cfg.get("model_type") != "llama":
        got = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise ModelError(
            f"{cfg_path}: model_type is {got!r}, not 'llama'",
            "twinrun's model supports Llama-architecture checkpoints only",
        )
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
        extra = (
            " (pytorch_model.bin is not loaded: convert it to safetensors)"
            if any(root.glob("*.bin"))
            else ""
        )
        raise ModelError(
            f"no safetensors weights in {root}{extra}",
            "save the checkpoint with safe_serialization=True",
        )
    return files
