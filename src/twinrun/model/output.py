"""What a forward of `CausalLM` returns, and the surfaces of the model that `model.invariant` and
`model.lora` take (so neither imports `model.build`, which imports them): `CausalLM` and torch
modules both satisfy `ModuleTree`."""

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
        position_ids: torch.Tensor | None = None,
    ) -> ModelOutput: ...


class ModuleTree(Protocol):
    """A tree of torch modules: an `nn.Module`, or `CausalLM` (which forwards to its model)."""

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...

    def modules(self) -> Iterator[nn.Module]: ...

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]: ...

    def get_submodule(self, target: str) -> nn.Module: ...
