"""Reading a Hugging Face checkpoint directory without building a model (no torch).

`read_model_config(dir)` returns config.json (ModelError when the directory or file is missing,
unreadable, or has no `model_type`); `weight_files(dir)` lists its *.safetensors (ModelError when
there are none, with a conversion hint when only pickle files are there). Whether transformers
knows the architecture as a causal LM is checked when the model is built (`model.build`).

`model_files(dir)` is exactly what building the model and its tokenizer reads — config.json,
generation_config.json, the tokenizer files, and the weights: `model.safetensors`, or the index
and every shard it names (an index naming a file outside the directory is refused). Hidden files,
READMEs and anything else the loader never opens are not in it. `model_sha256(dir)` hashes those
files framed by their path relative to the directory, so a byte-identical copy elsewhere has the
same digest, and swapping any file the loader reads changes it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from twinrun.core.errors import ModelError


def check_model_dir(root: Path) -> None:
    """ModelError unless `root` is a directory: one that is missing, or a file (a config or a
    weights file given for its checkpoint directory), each said as what it is."""
    hint = "point --model at a local Hugging Face checkpoint (or run `twinrun toy-model`)"
    if root.is_dir():
        return
    if root.exists():
        raise ModelError(
            f"--model {root} is a file, not a checkpoint directory",
            "give the directory that holds config.json and the weights",
        )
    if looks_like_hub_id(str(root)):
        hint = (
            f"{root} looks like a Hugging Face Hub id, and --model takes a local directory: "
            f"`hf download {root} --local-dir DIR`, then --model DIR"
        )
    raise ModelError(f"model directory {root} does not exist", hint)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def looks_like_hub_id(path: str) -> bool:
    """`owner/name` (a Hub repository id) whose owner is no local directory: `runs/nope` with
    a `runs/` here is a local path mistyped, `HuggingFaceTB/SmolLM2-135M-Instruct` is not."""
    return HUB_ID.fullmatch(path) is not None and not Path(path.split("/")[0]).exists()


ADAPTER_DIR_HINT = "point at a directory written by twinrun or PEFT's save_pretrained"


def check_adapter_directory(root: Path) -> None:
    """ModelError unless the adapter directory `root` (`--adapter`, `--init-adapter`) exists: a
    file check, which the training preflight runs before torch loads."""
    if not root.is_dir():
        raise ModelError(f"adapter directory {root} does not exist", ADAPTER_DIR_HINT)


def read_model_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json of a checkpoint directory; ModelError when missing or unreadable."""
    root = Path(model_dir)
    check_model_dir(root)
    hint = "point --model at a local Hugging Face checkpoint (or run `twinrun toy-model`)"
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


INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# what transformers reads besides the weights (AutoConfig, GenerationConfig, AutoTokenizer)
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt",
    "*.model", "chat_template*", "preprocessor_config.json",
)  # fmt: skip


def tokenizer_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The tokenizer files AutoTokenizer may read from the directory (sorted, no hidden files)."""
    root = Path(model_dir)
    found = {p for pat in TOKENIZER_FILES for p in root.glob(pat)}
    return sorted(p for p in found if p.is_file() and not p.name.startswith("."))


def shard_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """The weight files from_pretrained loads: the index and every shard it names, or
    model.safetensors. ModelError for an index that is unreadable or names a file outside the
    directory (or one that is missing)."""
    root = Path(model_dir)
    index = root / INDEX
    if not index.is_file():
        single = root / SINGLE
        return [single] if single.is_file() else weight_files(root)
    from twinrun.core.errors import DataError
    from twinrun.core.jsonlimits import load_json_file

    hint = "re-save the checkpoint with save_pretrained so its shards sit in the directory"
    try:
        body = load_json_file(index, "weights index")
    except DataError as exc:
        raise ModelError(f"cannot read {exc.message}", hint) from None
    weight_map = body.get("weight_map") if isinstance(body, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelError(f"{index}: no weight_map", hint)
    shards: set[Path] = set()
    for name in sorted({str(v) for v in weight_map.values()}):
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or rel.name.startswith(".") or not rel.parts:
            raise ModelError(f"{index} names a shard outside {root}: {name!r}", hint)
        if not (root / rel).is_file():
            raise ModelError(f"{index} names a shard that is missing: {root / rel}", hint)
        shards.add(root / rel)
    return [index, *sorted(shards)]


def model_files(model_dir: str | os.PathLike[str]) -> list[Path]:
    """Every file loading the model and its tokenizer reads (sorted)."""
    root = Path(model_dir)
    configs = [root / n for n in CONFIG_FILES if (root / n).is_file()]
    return sorted({*configs, *tokenizer_files(root), *shard_files(root)})


def model_sha256(
    model_dir: str | os.PathLike[str], taps: Mapping[Path, Callable[[bytes], None]] | None = None
) -> str:
    """One digest over exactly the files the loader reads (see `model_files`); `taps` as
    `core.digest.sha256_files` takes them."""
    from twinrun.core.digest import sha256_files

    root = Path(model_dir)
    check_model_dir(root)
    return sha256_files(model_files(root), root, taps)
