"""Batch-invariant mode's packed forward: a batch's real tokens run as one sequence.

`run_packed` is what `run_rows` (`twinrun.model.invariant`) runs when it can: the rows' real
tokens are laid end to end in one sequence, padded to a multiple of `CHUNK` tokens. Only what
mixes a row's own tokens runs per row; everything position-wise runs on the packed tokens:

- every linear layer (`F.linear`: projections, MLP, LoRA factors, output layer) on chunks of
  exactly `CHUNK` token rows, so each matmul has the same shape whatever the batch and a row's
  bits depend only on its tokens (a row's position inside a chunk does not change its bits: the
  tests check that on many positions);
- embeddings, norms, rotary embeddings and residual adds on the packed tensor (each token alone);
- attention per row, on the row's own queries and keys (`row_attention`: the model's own eager
  attention; the rows of one slot width — 32 or 64 tokens, then the next multiple of 32
  (`slot_width`) — as a batch of rows, each masked causally within its own tokens);
- the LoRA factors' weight gradients per row (`RowLinear`, which `LoRALinear` calls through
  `row_linear`): a row's tokens only, rows of one slot width as one batched matmul over
  zero-padded slots, handed to `row_gradients.collect`, which adds them into `.grad` row by row.

Positions restart at 0 for every row. A batch of one runs the same way, so a row's logits,
hidden states and gradient are the same bits in any batch. They are not the bits of the ordinary
forward (whose matmuls have as many rows as the row has tokens).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from twinrun.model.row_gradients import collect

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
    back: torch.Tensor  # [used] for each packed token, its slot in the groups' concatenation


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
    starts, at = [], 0
    for n in lengths:
        starts.append(at)
        at += n
    total = -(-at // CHUNK) * CHUNK
    by_width: dict[int, list[int]] = {}
    for row, n in enumerate(lengths):
        by_width.setdefault(slot_width(n), []).append(row)
    groups = []
    back = torch.empty(at, dtype=torch.long)
    base = 0
    for width in sorted(by_width):
        rows = by_width[width]
        slots = torch.empty(len(rows), width, dtype=torch.long)
        zero = torch.full((len(rows), width), total, dtype=torch.long)
        mask = torch.zeros(len(rows), 1, width, width, dtype=torch.bool)
        for i, row in enumerate(rows):
            s, n = starts[row], lengths[row]
            slots[i] = s
            slots[i, :n] = torch.arange(s, s + n)
            zero[i, :n] = slots[i, :n]
            mask[i, 0, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
            back[s : s + n] = base + i * width + torch.arange(n)
        base += len(rows) * width
        groups.append(
            Group(tuple(rows), width, slots.view(-1).to(device), zero.view(-1).to(device),
                  mask.to(device))
        )  # fmt: skip
    return Plan(tuple(starts), tuple(lengths), total, tuple(groups), back.to(device))


def chunked_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear` on `CHUNK`-token slices of x ([1, N, in], N a multiple of CHUNK): one batched
    matmul with a batch entry per slice (each entry the same [CHUNK, in] @ [in, out] product
    whatever the number of slices; the tests hold its bits to a lone slice's)."""
    k = x.shape[-2] // CHUNK
    x3 = x.reshape(k, CHUNK, x.shape[-1])
    w = weight.t().expand(k, *weight.t().shape)
    y = torch.bmm(x3, w) if bias is None else torch.baddbmm(bias.expand(k, CHUNK, -1), x3, w)
    return y.reshape(*x.shape[:-1], y.shape[-1])


class RowLinear(torch.autograd.Function):
    """x @ W.T on chunks; W's gradient per row (the row's tokens only), collected by
    `row_gradients.collect` under this forward's order and added in row order."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, plan: Plan, order: int) -> Any:
        ctx.save_for_backward(x, weight)
        ctx.plan, ctx.order = plan, order
        return chunked_linear(x, weight)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, weight = ctx.saved_tensors
        plan: Plan = ctx.plan
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = chunked_linear(grad, weight.t())
        g2 = torch.cat([grad.reshape(-1, grad.shape[-1]), grad.new_zeros(1, grad.shape[-1])])
        x2 = torch.cat([x.reshape(-1, x.shape[-1]), x.new_zeros(1, x.shape[-1])])
        for group in plan.groups:
            r, w = len(group.rows), group.width
            g3 = g2.index_select(0, group.zero_slots).view(r, w, -1)
            x3 = x2.index_select(0, group.zero_slots).view(r, w, -1)
            gw = torch.bmm(g3.transpose(1, 2), x3).to(weight.dtype)
            for i, row in enumerate(group.rows):
                collect(row, ctx.order, (weight,), (gw[i],))
        return grad_x, None, None, None


def recording_rows(weight: torch.Tensor) -> bool:
    """Whether a packed forward is recording gradients for `weight` (use `row_linear`)."""
    return bool(_active) and weight.requires_grad and torch.is_grad_enabled()


def row_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A LoRA factor's linear map inside a packed forward (`RowLinear`)."""
    return RowLinear.apply(x, weight, _active[-1], _order[-1])


class PackedMode(TorchFunctionMode):
    """Runs every `F.linear` on `CHUNK`-token slices (torch's own override mechanism)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return chunked_linear(x, weight, bias)
        return func(*args, **kwargs)


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
    for group in plan.groups:
        r, w = len(group.rows), group.width

        def rows_of(x: torch.Tensor, group: Group = group, r: int = r, w: int = w) -> torch.Tensor:
            x = x[0].index_select(1, group.slots)  # [heads, R*W, d]
            return x.view(x.shape[0], r, w, x.shape[-1]).transpose(0, 1)

        mask = torch.zeros(group.mask.shape, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill(~group.mask, torch.finfo(query.dtype).min)
        out = eager(module, rows_of(query), rows_of(key), rows_of(value), mask, **kwargs)[0]
        outs.append(out.reshape(r * w, *out.shape[2:]))  # [R*W, heads, d]
    laid = outs[0] if len(outs) == 1 else torch.cat(outs)
    packed_out = laid.index_select(0, plan.back)
    used = packed_out.shape[0]
    if plan.total > used:
        tail = packed_out.new_zeros(plan.total - used, *packed_out.shape[1:])
        packed_out = torch.cat([packed_out, tail])
    return packed_out[None], None


def _register() -> None:
    from transformers import AttentionInterface

    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, row_attention)


@contextlib.contextmanager
def packed(hf: Any, plan: Plan, order: int) -> Iterator[None]:
    """Inside the block, `hf` runs packed (see the module docstring)."""
    _register()
    config = hf.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION
    _active.append(plan)
    _order.append(order)
    try:
        with PackedMode():
            yield
    finally:
        _active.pop()
        _order.pop()
        config._attn_implementation = before


def pack(input_ids: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed ids [1, total], position ids [1, total], the packed index of each row's tokens in
    the [B*T] right-padded layout)."""
    b, t = input_ids.shape
    dev = input_ids.device
    rows = torch.arange(t, device=dev)[None, :] < torch.tensor(plan.lengths, device=dev)[:, None]
    flat = rows.reshape(-1).nonzero().squeeze(1)
    ids = torch.zeros(plan.total, dtype=input_ids.dtype, device=dev)
    used = flat.numel()
    ids[:used] = input_ids.reshape(-1)[flat]
    pos = torch.zeros(plan.total, dtype=torch.long, device=dev)
    pos[:used] = torch.cat([torch.arange(n, device=dev) for n in plan.lengths])
    return ids[None], pos[None], flat


def unpack(packed_values: torch.Tensor, flat: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """[1, total, D] packed → [B, T, D] right-padded with zeros."""
    d = packed_values.shape[-1]
    used = flat.numel()
    out = packed_values.new_zeros(b * t, d)
    return out.index_copy(0, flat, packed_values[0, :used]).view(b, t, d)
