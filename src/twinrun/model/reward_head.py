"""The reward model's scalar head: a bias-free linear map from the final-norm hidden state of the
last real token to one score. Initialised from `stream(seed, "reward_head")` (Kaiming-uniform,
as torch initialises a Linear), saved beside the adapter as `reward_head.safetensors` with the
key `score.weight` — the name `AutoModelForSequenceClassification` gives Llama's head, so a PEFT
user can load both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from twinrun.core.errors import ModelError
from twinrun.core.rng import stream, torch_tensor
from twinrun.core.safetensors_io import read_safetensors, write_tensors
from twinrun.objectives.reward import pool_last

HEAD_FILE = "reward_head.safetensors"
HEAD_KEY = "score.weight"
HEAD_METADATA = {"format": "pt"}


def new_reward_head(hidden_size: int, seed: int) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden_size, 1, bias=False)
    with torch.no_grad():
        head.weight.copy_(
            torch_tensor(stream(seed, "reward_head").kaiming_uniform((1, hidden_size)))
        )
    return head


def scores(
    model: Any, head: torch.nn.Linear, ids: torch.Tensor, attn: torch.Tensor
) -> torch.Tensor:
    """[B] float32 scores: head(final_norm(hidden at the last layer))[last real token]."""
    if getattr(model, "batch_invariant", False):  # each row alone: twinrun.model.invariant
        from twinrun.model.invariant import last_token_scores

        out = model.run(ids, attn, hidden_layer=model.num_layers)
        return last_token_scores(model.final_norm(), head, out.hidden, attn)
    hidden = model.last_hidden(ids, attn)
    return head(pool_last(hidden, attn).float()).squeeze(-1)


def head_tensors(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """What `reward_head.safetensors` holds for this head weight."""
    return {HEAD_KEY: weight.detach().float().cpu().contiguous()}


def save_reward_head(head: torch.nn.Linear, out_dir: str | Path) -> None:
    """Write `reward_head.safetensors` into `out_dir`, atomically."""
    write_tensors(Path(out_dir) / HEAD_FILE, head_tensors(head.weight), HEAD_METADATA)


def load_reward_head(adapter_dir: str | Path) -> torch.nn.Linear | None:
    """The head saved beside an adapter, or None when the adapter has none."""
    path = Path(adapter_dir) / HEAD_FILE
    if not path.is_file():
        return None
    hint = "re-create it with twinrun tune reward"
    tensors = read_safetensors(path, "reward head", hint, ModelError).tensors
    weight = tensors.get(HEAD_KEY)
    if (
        weight is None
        or weight.ndim != 2
        or weight.shape[0] != 1
        or not weight.is_floating_point()
        or not bool(torch.isfinite(weight).all())
    ):
        raise ModelError(f"{path}: not a reward head (no finite [1, hidden] {HEAD_KEY})", hint)
    head = torch.nn.Linear(weight.shape[1], 1, bias=False)
    with torch.no_grad():
        head.weight.copy_(weight)
    return head


def describe(path: str | Path) -> str:
    return json.dumps({"file": HEAD_FILE, "key": HEAD_KEY, "path": str(path)})
