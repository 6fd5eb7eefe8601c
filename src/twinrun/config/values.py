"""Run settings whose values need parsing or resolving: the LoRA targets (`q_proj,v_proj` or
`all-linear`), plugin environment arguments (`--env-arg KEY=VALUE`), and the most tokens per row
(given, or the model config's `max_position_embeddings`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from twinrun.core.errors import ConfigError

ALL_LINEAR = "all-linear"


def parse_env_args(pairs: tuple[str, ...] | list[str]) -> dict[str, Any] | None:
    """`--env-arg KEY=VALUE` (repeatable); VALUE is read as JSON when it parses, else a string.
    The error never shows the pair: its value may be a secret."""
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for i, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env-arg number {i} is not KEY=VALUE", "e.g. --env-arg level=3")
        try:
            out[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            out[key] = value
    return out


_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


def parse_lora_targets(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """`q_proj,v_proj` or `all-linear` (or a TOML list) -> the list the run records."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items]


def targets_problems(targets: list[str], name: str) -> list[str]:
    if not targets or any(not t for t in targets):
        return [f"{name} must name at least one module, with no empty names"]
    if ALL_LINEAR in targets and len(targets) > 1:
        return [f"{name}: {ALL_LINEAR} stands alone"]
    bad = [t for t in targets if t != ALL_LINEAR and not _MODULE_NAME.match(t)]
    if bad:
        return [f"{name} must be module names like q_proj (letters, digits, _ and .)"]
    if len(set(targets)) != len(targets):
        return [f"{name} names a module twice"]
    return []


def resolve_max_length(max_length: int | None, model_config: Mapping[str, Any]) -> int:
    """The most tokens per row: `max_length` when given, else the model config's
    `max_position_embeddings`; an error when neither is there (no silent 2048)."""
    if max_length is not None:
        return max_length
    positions = model_config.get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool) and positions >= 1:
        return positions
    raise ConfigError(
        "the model config has no max_position_embeddings and --max-length is not given",
        "pass --max-length N (training.max_length in TOML): the most tokens per row",
    )
