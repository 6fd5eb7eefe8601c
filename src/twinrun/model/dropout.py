"""LoRA dropout (`--lora-dropout P`, PEFT's `lora_dropout`), its masks drawn from twinrun's keyed
stream instead of a framework generator.

What it computes. As PEFT's LoRA layer: dropout acts on the LoRA branch's input only,
`result = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`. `dropout(x)` zeroes an element
with probability P and multiplies a kept one by `1 / (1 - P)` (inverted dropout: the factor is
computed in float64 and rounded once to the input's dtype, float32, LoRA's). It acts only inside
`lora_dropout(draw)`, which the training forwards whose gradient is taken set
(`twinrun.train.recipes`); sampling, generation, evaluation, GRPO's old log-probs and every
forward with the adapter off (a reference) run without it.

The draw. Element (t, j) — position t of a row, feature j of a LoRA layer's input — is kept
when draw number `t * in_features + j` of

    stream(seed, "lora_dropout", step, module, *row)

read as a uniform `(u >> 11) * 2**-53` is >= P; `step` is the optimizer step, `module` the LoRA
layer's module name in the checkpoint (`model.layers.0.self_attn.q_proj`), `row` the row's
identity within the step (a tuple of integers: which the objectives use is said in
`twinrun.train.recipes.base.dropout_for`). A row's mask is a function of (seed, step, module,
row, position, feature) alone, laid out row-major so that a longer padded batch only reads
further draws of each row: it does not depend on the padded width of the batch the row rode in,
the batch size, the accumulation split, the number of processes, the thread count, or gradient
checkpointing (a layer's recompute runs under the draw its forward ran under:
`recompute_contexts`, torch's checkpoint `context_fn`). A forward's rows are drawn as one block
(the module's key absorbed once, then each row's: `extend_key`, `first_draws`).

Where the rows are. A forward's rows are `draw.keys`, in the order of the batch dimension of a
LoRA layer's input ([B, T, in]). Batch-invariant mode (`twinrun.model.invariant`) runs a row
alone (`one_row`) or every row's real tokens end to end in one packed sequence (`packed_rows`:
each row's draws at its span, nothing kept in the padding after them).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import numpy as np
import torch

from twinrun.core.rng import extend_key, first_draws, stream_key

PURPOSE = "lora_dropout"
RowKey = tuple[int, ...]


@dataclass(frozen=True)
class RowDropout:
    """The LoRA dropout of one forward: the probability and what its masks are keyed by."""

    p: float
    seed: int
    step: int
    keys: tuple[RowKey, ...]
    """Each row's identity, in the order of the forward's rows."""
    spans: tuple[tuple[int, int], ...] | None = None
    """Packed rows: each row's (start, length) in the one packed sequence; None: row b is x[b]."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p) and 0.0 <= self.p < 1.0):
            raise ValueError(f"a dropout probability is in [0, 1), got {self.p!r}")

    @property
    def threshold(self) -> int:
        """Kept: `u >= threshold` for a raw draw u, the same as `(u >> 11) * 2**-53 >= p`
        (`p * 2**53` is exact and `u >> 11` an integer: `u >> 11 >= ceil(p * 2**53)`)."""
        return math.ceil(self.p * 2.0**53) << 11

    def keep(self, count: int, module: str) -> np.ndarray:
        """[rows, count] bool: which of its first `count` elements each row keeps of `module`'s
        input (the module's key absorbed once, then each row's)."""
        prefix = stream_key(self.seed, PURPOSE, self.step, module)
        keys = [extend_key(prefix, *row) for row in self.keys]
        return first_draws(keys, count) >= np.uint64(self.threshold)

    def mask(self, shape: torch.Size, module: str) -> np.ndarray:
        """The keep mask of an input of `shape`: [rows, ..., features], packed [1, N, features]."""
        features = shape[-1]
        if self.spans is not None:
            longest = max((length for _, length in self.spans), default=0)
            rows = self.keep(longest * features, module)
            out = np.zeros((shape[-2], features), dtype=bool)
            for kept, (start, length) in zip(rows, self.spans, strict=True):
                out[start : start + length] = kept[: length * features].reshape(length, features)
            return out.reshape(shape)
        if len(shape) < 2 or shape[0] != len(self.keys):
            raise ValueError(f"{len(self.keys)} dropout rows for an input of shape {tuple(shape)}")
        return self.keep(math.prod(shape[1:]), module).reshape(shape)

    def apply(self, x: torch.Tensor, module: str) -> torch.Tensor:
        """`x` with this forward's dropout of `module`: kept elements times 1 / (1 - p)."""
        keep = torch.from_numpy(self.mask(x.shape, module))
        return x * keep.to(x.device, x.dtype).mul_(1.0 / (1.0 - self.p))

    def only(self, row: int) -> RowDropout:
        """The dropout of row `row` run alone (a forward of that one row)."""
        return replace(self, keys=(self.keys[row],), spans=None)

    def packed(self, starts: tuple[int, ...], lengths: tuple[int, ...]) -> RowDropout:
        """The dropout of these rows packed end to end: row r's tokens at `starts[r]`."""
        return replace(self, spans=tuple(zip(starts, lengths, strict=True)))


_in_effect: list[RowDropout | None] = []


def in_effect() -> RowDropout | None:
    """The dropout LoRA layers apply now (None: none)."""
    return _in_effect[-1] if _in_effect else None


@contextlib.contextmanager
def lora_dropout(draw: RowDropout | None) -> Iterator[None]:
    """Inside the block LoRA layers drop their input as `draw` says (None: they drop nothing)."""
    _in_effect.append(draw)
    try:
        yield
    finally:
        _in_effect.pop()


def one_row(row: int) -> AbstractContextManager[None]:
    """Inside, the forward runs row `row` of the dropout in effect alone."""
    draw = in_effect()
    return lora_dropout(None if draw is None else draw.only(row))


def packed_rows(starts: tuple[int, ...], lengths: tuple[int, ...]) -> AbstractContextManager[None]:
    """Inside, the forward runs the rows of the dropout in effect packed end to end."""
    draw = in_effect()
    return lora_dropout(None if draw is None else draw.packed(starts, lengths))


def recompute_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    """torch.utils.checkpoint's `context_fn`, called as a checkpointed layer runs forward: the
    forward runs as it is, and its recompute in the backward under the dropout in effect now."""
    return contextlib.nullcontext(), lora_dropout(in_effect())


def dropped(x: torch.Tensor, module: str) -> torch.Tensor:
    """`x` as the LoRA layer named `module` reads it: with the dropout in effect, if any."""
    draw = in_effect()
    return x if draw is None else draw.apply(x, module)
