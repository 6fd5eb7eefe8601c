"""What a forward of `CausalLM` returns, and the surface batch-invariant mode needs from the model
(so `model.invariant` does not import `model.build`, which imports it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V] float32
    hidden: torch.Tensor | None = None  # [B, T, H], when `hidden_layer` was asked


class RowModel(Protocol):
    """The model `run_rows` runs one row at a time (`CausalLM`)."""

    def modules(self) -> Iterator[nn.Module]: ...

    def run_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        kv_cache: Any,
        hidden_layer: int | None,
        steer: tuple[int, torch.Tensor] | None,
    ) -> ModelOutput: ...
