"""Batch-invariant mode's packed forward: a batch's real tokens run as one sequence.

`run_packed` is what `run_rows` (`twinrun.model.invariant`) runs when it can: the rows' real
tokens are laid end to end in one sequence, padded to a multiple of `CHUNK` tokens. Only what
mixes a row's own tokens runs per row; everything position-wise runs on the packed tokens:

- every linear layer (each `nn.Linear` of the model: projections, MLP, LoRA factors, output
  layer; `chunked_linears` points their forward at `chunked_linear` for the forward, and
  tests/unit/model/test_row_gradients.py checks that no `F.linear` call is left) on chunks of
  exactly `CHUNK` token rows, so each matmul has the same shape whatever the batch and a row's
  bits depend only on its tokens (a row's position inside a chunk does not change its bits: the
  tests check that on many positions);
- embeddings, norms, rotary embeddings and residual adds on the packed tensor (each token alone);
- attention per row, on the row's own queries and keys (`row_attention`: the model's own eager
  attention; the rows of one slot width — 32 or 64 tokens, then the next multiple of 32
  (`slot_width`) — as a batch of rows, each masked causally within its own tokens);
- the LoRA factors' weight gradients per row (`RowLoRA`, which `LoRALinear` calls through
  `row_lora`: both factors in one autograd node): a row's tokens only, rows of one slot width as
  one batched matmul over zero-padded slots, the rows stacked in row order and handed to
  `row_gradients.collect_rows`, which adds them into `.grad` row by row.

Fewer, larger calls (the cost on short rows is per call, bench/batch_invariant.py): what depends
only on the rows' lengths (slots, masks, positions, the groups' row order) is made once per
forward (`plan_for`, `Plan.masks`), not per layer; the LoRA A factors of q, k and v share one
slot layout of their input (`Plan.slotted`); a forward's row gradients go to `.grad` as one
`index_add_` per parameter.

Positions restart at 0 for every row. A batch of one runs the same way, so a row's logits,
hidden states and gradient are the same bits in any batch. They are not the bits of the ordinary
forward (whose matmuls have as many rows as the row has tokens).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from twinrun.model.row_gradients import collect_rows

CHUNK = 64
ATTENTION = "twinrun_rows"


@dataclass(frozen=True)
class Group:
    """Rows that share a slot width: each row's tokens in `width` slots (its own tokens first)."""

    rows: tuple[int, ...]
    width: int
    slots: torch.Tensor  # [R * width] packed index of each slot; a padded slot: the row's first
    zero_slots: torch.Tensor  # the same, a padded slot pointing at a zero row (index `total`)
    mask: torch.Tensor  # [R, 1, W, W] bool: causal within the row's own tokens


@dataclass(frozen=True)
class Plan:
    """Where each row sits in the packed sequence, and its attention group."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    total: int  # padded to a multiple of CHUNK
    groups: tuple[Group, ...]
    back: torch.Tensor  # [total] each packed token's slot in the groups' concatenation + a zero
    order: torch.Tensor | None  # [B] each row's place among the groups' rows; None: in order
    positions: torch.Tensor  # [total] each packed token's position in its row (0 at the padding)
    additive: dict[torch.dtype, tuple[torch.Tensor, ...]] = field(default_factory=dict)
    last_slotted: list[Any] = field(default_factory=list)  # [key, x, `slotted(x)`]

    def masks(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """Each group's additive attention mask in `dtype` (0 where a query sees a key, the
        dtype's lowest value elsewhere), made at the first layer that asks."""
        if dtype not in self.additive:
            low = torch.finfo(dtype).min
            self.additive[dtype] = tuple(
                torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, low)
                for m in (g.mask for g in self.groups)
            )
        return self.additive[dtype]

    def slotted(self, x: torch.Tensor, keep: bool = False) -> list[torch.Tensor]:
        """x ([1, N, d]) laid out in each group's slots, [R, W, d], a padded slot zero. With
        `keep`, the last one kept is reused for a tensor on the same memory, unchanged since (the
        LoRA factors of q, k and v read the same input; the kept tensor holds its memory)."""
        key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x._version)
        if keep and self.last_slotted and self.last_slotted[0] == key:
            return list(self.last_slotted[2])
        x2 = F.pad(x.reshape(-1, x.shape[-1]), (0, 0, 0, 1))  # + a zero row (index `total`)
        out = [x2.index_select(0, g.zero_slots).view(len(g.rows), g.width, -1) for g in self.groups]
        if keep:
            self.last_slotted[:] = [key, x, out]
        return out


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    """A list of ints as an int64 tensor (through a buffer: `torch.tensor` converts one element
    at a time)."""
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device, copy=True)


_active: list[Plan] = []
_order: list[int] = []


def slot_width(length: int) -> int:
    """The attention width a row of `length` tokens gets (a function of the row alone): 32 or 64
    up to 64 tokens, so that short rows share a group; above that the next multiple of 32, so a
    long row wastes at most 31 padded slots (power-of-two widths wasted up to 3/4 of a long row's
    attention work)."""
    if length <= 32:
        return 32
    return -(-length // 32) * 32 if length > 64 else 64


def plan_for(lengths: list[int], device: torch.device) -> Plan:
    """Where each row of `lengths` tokens sits in the packed sequence, and its attention group
    (index lists built in Python, each made a tensor once)."""
    starts = list(itertools.accumulate(lengths, initial=0))[:-1]
    used = sum(lengths)
    total = -(-used // CHUNK) * CHUNK
    by_width: dict[int, list[int]] = {}
    for row, n in enumerate(lengths):
        by_width.setdefault(slot_width(n), []).append(row)
    groups = []
    back = [0] * total
    base = 0
    for width in sorted(by_width):
        rows = by_width[width]
        slots: list[int] = []
        zero: list[int] = []
        for i, row in enumerate(rows):
            s, n = starts[row], lengths[row]
            slots += [*range(s, s + n), *[s] * (width - n)]
            zero += [*range(s, s + n), *[total] * (width - n)]
            back[s : s + n] = range(base + i * width, base + i * width + n)
        base += len(rows) * width
        at = torch.arange(width)
        real = torch.tensor([lengths[row] for row in rows])
        # [R, 1, W, W]: query a sees key b when b <= a < the row's length
        mask = (at[None, :] <= at[:, None])[None] & (at[None, :, None] < real[:, None, None])
        groups.append(
            Group(tuple(rows), width, _long(slots, device), _long(zero, device),
                  mask[:, None].to(device))
        )  # fmt: skip
    back[used:] = [base] * (total - used)  # the padding reads the zero row after the groups
    laid = [row for g in groups for row in g.rows]
    order = None
    if laid != sorted(laid):
        order = _long(sorted(range(len(laid)), key=laid.__getitem__), device)
    positions = [j for n in lengths for j in range(n)] + [0] * (total - used)
    return Plan(
        tuple(starts), tuple(lengths), total, tuple(groups), _long(back, device), order,
        _long(positions, device),
    )  # fmt: skip


def chunked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` on `CHUNK`-token slices of x ([1, N, in], N a multiple of CHUNK): one batched
    matmul with a batch entry per slice (each entry the same [CHUNK, in] @ [in, out] product
    whatever the number of slices; the tests hold its bits to a lone slice's)."""
    k = x.shape[-2] // CHUNK
    x3 = x.reshape(k, CHUNK, x.shape[-1])
    wt = weight.t()
    w = wt.expand(k, *wt.shape)
    y = torch.bmm(x3, w) if bias is None else torch.baddbmm(bias.expand(k, CHUNK, -1), x3, w)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def row_weight_grads(
    plan: Plan, grad: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, keep: bool = False
) -> torch.Tensor:
    """[B, out, in]: each row's gradient of a weight that maps x ([1, N, in]) to the output
    whose gradient is `grad` ([1, N, out]) — over the row's tokens only, the rows of one slot
    width as one batched matmul over zero-padded slots — in row order. `keep`: x's slots may
    be reused (`Plan.slotted`)."""
    per_group = [
        torch.bmm(g3.transpose(1, 2), x3).to(dtype)
        for g3, x3 in zip(plan.slotted(grad), plan.slotted(x, keep), strict=True)
    ]
    laid = per_group[0] if len(per_group) == 1 else torch.cat(per_group)
    return laid if plan.order is None else laid.index_select(0, plan.order)


class RowLoRA(torch.autograd.Function):
    """A LoRA update's two factors, x @ A.T @ B.T, on chunks; A's and B's gradients per row (the
    row's tokens only), collected by `row_gradients.collect_rows` under this forward's order and
    added in row order. The backward computes what two chained per-factor nodes would: B's
    input gradient, B's rows, then A's input gradient and rows."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(
        ctx: Any, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, plan: Plan, order: int
    ) -> Any:
        h = chunked_linear(x, a)
        ctx.save_for_backward(x, a, h, b)
        ctx.plan, ctx.order = plan, order
        return chunked_linear(h, b)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, a, h, b = ctx.saved_tensors
        plan: Plan = ctx.plan
        grad_h = chunked_linear(grad, b.t())
        collect_rows(ctx.order, b, row_weight_grads(plan, grad, h, b.dtype))
        grad_x = chunked_linear(grad_h, a.t()) if ctx.needs_input_grad[0] else None
        collect_rows(ctx.order, a, row_weight_grads(plan, grad_h, x, a.dtype, keep=True))
        return grad_x, None, None, None, None


def recording_rows(weight: torch.Tensor) -> bool:
    """Whether a packed forward is recording gradients for `weight` (use `row_lora`)."""
    return bool(_active) and weight.requires_grad and torch.is_grad_enabled()


def row_lora(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A LoRA update's factors inside a packed forward (`RowLoRA`)."""
    return RowLoRA.apply(x, a, b, _active[-1], _order[-1])


def _chunked_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return chunked_linear(x, module.weight, module.bias)


@contextlib.contextmanager
def chunked_linears(linears: list[nn.Linear]) -> Iterator[None]:
    """Inside the block each of `linears` runs `chunked_linear` on its weight and bias (an
    instance `forward`, so its hooks still run; set in the instance's `__dict__`, as
    `nn.Module.__setattr__` would for a plain value, and taken back on leaving)."""
    before = [m.__dict__.get("forward") for m in linears]
    for m in linears:
        m.__dict__["forward"] = _chunked_forward.__get__(m)
    try:
        yield
    finally:
        for m, had in zip(linears, before, strict=True):
            if had is None:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = had


def row_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The model's eager attention on each row's own tokens: rows of one slot width as a batch
    of rows [R, heads, W, d], each masked causally within its own tokens; the outputs laid back
    in packed order, zeros at the padding."""
    plan = _active[-1]
    eager = sys.modules[type(module).__module__].eager_attention_forward
    outs = []
    for group, mask in zip(plan.groups, plan.masks(query.dtype), strict=True):
        r, w = len(group.rows), group.width

        def rows_of(x: torch.Tensor, group: Group = group, r: int = r, w: int = w) -> torch.Tensor:
            x = x.index_select(2, group.slots)  # [1, heads, R*W, d]
            return x.view(x.shape[1], r, w, x.shape[-1]).transpose(0, 1)

        out = eager(module, rows_of(query), rows_of(key), rows_of(value), mask, **kwargs)[0]
        outs.append(out.reshape(r * w, *out.shape[2:]))  # [R*W, heads, d]
    laid = F.pad(outs[0] if len(outs) == 1 else torch.cat(outs), (0, 0, 0, 0, 0, 1))  # + a zero
    return laid.index_select(0, plan.back)[None], None  # row, which the padding reads


@functools.cache
def _register() -> None:
    """Register `row_attention` with transformers, once per process."""
    from transformers import AttentionInterface

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, row_attention)


@contextlib.contextmanager
def packed(hf: Any, plan: Plan, order: int, linears: list[nn.Linear]) -> Iterator[None]:
    """Inside the block, `hf` (whose `nn.Linear` layers are `linears`) runs packed (see the
    module docstring)."""
    _register()
    config = hf.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    _active.append(plan)
    _order.append(order)
    try:
        with chunked_linears(linears):
            yield
    finally:
        _active.pop()
        _order.pop()
        config._attn_implementation = before


def pack(input_ids: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed ids [1, total], position ids [1, total], the packed index of each row's tokens in
    the [B*T] right-padded layout)."""
    t = input_ids.shape[1]
    dev = input_ids.device
    flat = _long([row * t + j for row, n in enumerate(plan.lengths) for j in range(n)], dev)
    ids = torch.zeros(plan.total, dtype=input_ids.dtype, device=dev)
    ids[: flat.numel()] = input_ids.reshape(-1)[flat]
    return ids[None], plan.positions[None], flat


def unpack(packed_values: torch.Tensor, flat: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """[1, total, D] packed → [B, T, D] right-padded with zeros."""
    d = packed_values.shape[-1]
    used = flat.numel()
    out = packed_values.new_zeros(b * t, d)
    return out.index_copy(0, flat, packed_values[0, :used]).view(b, t, d)
