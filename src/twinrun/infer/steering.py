"""Steering vectors at generation time (`twinrun generate --steer FILE --steer-scale S`).

A steering artifact is what `twinrun extract --steering` writes: a safetensors file with one
float32 tensor `steering_vector` [H] and string metadata at its top level (format
`twinrun.infer.steering.v1`, `layer`, `pool`, `precision`, `chat_template`, the model SHA256, ...).
`attach_steering` checks it against the model and sets `model.steering = (layer, S * vector)`:
every forward then adds that vector to the residual stream at HF's `hidden_states[layer]`, at every
position — prompt and generated tokens alike, so the KV cache holds steered keys and values.
`S * vector` is one float32 multiply, so a run is as reproducible as one without steering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from twinrun.core import reading
from twinrun.core.errors import ConfigError, DataError, ModelError

STEERING_FORMAT = "twinrun.infer.steering.v1"
STEERING_KEY = "steering_vector"


@dataclass(frozen=True)
class SteeringArtifact:
    vector: torch.Tensor  # [H] float32
    layer: int
    metadata: dict[str, str]


def read_steering(path: str | Path) -> SteeringArtifact:
    """Load and check a steering artifact; DataError names the file on any problem."""
    from twinrun.core.safetensors_io import read_safetensors

    p = Path(path)
    hint = "write one with twinrun extract --steering"
    reading.open_regular(p, "steering file", DataError, hint).close()  # a FIFO would block
    got = read_safetensors(p, "steering vector", "write it again with twinrun extract --steering")
    metadata, keys = dict(got.metadata), list(got.tensors)
    vector = got.tensors.get(STEERING_KEY)
    if metadata.get("format") != STEERING_FORMAT or vector is None:
        raise DataError(
            f"{p}: not a twinrun steering artifact (format {metadata.get('format')!r}, "
            f"tensors {keys})",
            "write one with twinrun extract --steering",
        )
    if vector.dim() != 1 or vector.dtype != torch.float32:
        raise DataError(f"{p}: {STEERING_KEY} must be a float32 [H] vector")
    try:
        layer = int(metadata["layer"])
    except (KeyError, ValueError) as exc:
        raise DataError(f"{p}: metadata has no integer 'layer'") from exc
    return SteeringArtifact(vector=vector, layer=layer, metadata=metadata)


def attach_steering(model: Any, path: str | Path, scale: float) -> dict[str, str]:
    """Make every forward of `model` add `scale * vector` at the artifact's layer; returns the
    artifact's metadata."""
    if not math.isfinite(scale):
        raise ConfigError(f"--steer-scale must be a finite number, got {scale}")
    art = read_steering(path)
    hidden, layers = model.hidden_size, model.num_layers
    if art.vector.shape[0] != hidden:
        raise ModelError(
            f"{path}: steering vector has {art.vector.shape[0]} dimensions, the model's hidden "
            f"size is {hidden}",
            "extract the vector from this model",
        )
    if not 0 <= art.layer <= layers:
        raise ModelError(f"{path}: layer {art.layer} is outside [0, {layers}] for this model")
    device = next(model.parameters()).device
    model.steering = (art.layer, (art.vector * scale).to(device))
    return art.metadata


def detach_steering(model: Any) -> None:
    model.steering = None
