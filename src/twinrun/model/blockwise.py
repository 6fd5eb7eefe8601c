"""`--attention blockwise`: causal attention in memory linear in the sequence length, with one
result on every CPU and thread count in portable mode.

FlashAttention-2's scheme in plain torch. Queries and keys are cut into blocks of `BLOCK`
positions (the sequence zero-padded to a multiple of it), always visited in the same order:
query blocks ascending, and for each the key blocks ascending up to the causal diagonal (key
blocks wholly beyond it are skipped). The forward keeps a running row maximum, row sum and
output per query block (online softmax) and saves only Q, K, V, the output and each row's
logsumexp; the backward recomputes each block's probabilities from those. Nothing of size T x T
is kept: the largest temporary is one block's scores, [batch x heads, BLOCK, BLOCK].

GQA: the query heads of one key/value head are one batch entry of the block products (a block of
queries is [group x BLOCK, d] against [BLOCK, d] keys), so keys and values are never repeated.

Masking is causal + key padding, from transformers' 2D attention mask (`blockwise_mask`, the
mask function registered under the same name: it returns the padding mask and the query offset,
never a T x T mask). A query at a padded position is *dead*: its output is zero and so is its
gradient (its output is never read by a real token). Padded queries, keys and values are zeroed
before any product, so a padded position cannot change a real row's bits.

Why the bytes do not depend on the CPU or the thread count (portable mode,
`TWINRUN_CPU_KERNELS=portable`): every product is a `bmm` and every exp/log a `torch.exp`/
`torch.log`, which portable mode sends to twinrun's exact kernels (`twinrun.core.exact_matmul`,
`twinrun.core.portable_math`); the row sums are `bmm`s against a ones vector (exact sums, one
rounding); the rest is elementwise IEEE arithmetic, `amax` (order-free) and selections, in a
fixed order of blocks. Why a row has the same bits alone or inside a right-padded batch: every
product has the same shape either way (full blocks; the exact products slice each row and column
on its own piece of the inner dimension), the padding is zeros, and a block a row does not see
leaves that row's running values untouched. These are not eager attention's bytes (another
summation order); they are within float tolerance of them
(tests/unit/model/test_blockwise_attention.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from twinrun.core.errors import ModelError

NAME = "blockwise"
BLOCK = 128  # query and key positions per block


@dataclass(frozen=True)
class BlockwiseMask:
    """What the attention needs of the mask: which keys are real ([B, K] bool; None: all) and
    where the queries sit among the keys (query i is at key position i + offset)."""

    keys: torch.Tensor | None
    offset: int


def blockwise_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    **_kwargs: Any,
) -> BlockwiseMask:
    """transformers' mask hook for `blockwise` (AttentionMaskInterface): the 2D padding mask and
    the query offset, never a 4D mask. Only the plain causal mask is supported."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask

    if mask_function is not causal_mask_function:
        raise ModelError(
            "--attention blockwise supports causal full attention only (this model asks for "
            "another mask: sliding window, chunked or packed rows)",
            "use --attention eager or sdpa for this model",
        )
    q0, k0 = int(q_offset), int(kv_offset)
    keys = prepare_padding_mask(attention_mask, kv_length, k0)
    if keys is not None:
        keys = keys[:, k0 : k0 + kv_length].to(torch.bool)
    return BlockwiseMask(keys, q0 - k0)


def _padded(x: torch.Tensor, length: int) -> torch.Tensor:
    """x [..., T, d] zero-padded along T to `length`."""
    return F.pad(x, (0, 0, 0, length - x.shape[-2]))


def _rowsum(x: torch.Tensor) -> torch.Tensor:
    """x [N, R, C] summed over C as one product against ones ([N, R, 1]): exact in portable mode."""
    ones = x.new_ones(1, x.shape[-1], 1).expand(x.shape[0], -1, -1)
    return torch.bmm(x, ones)


class _Blocks:
    """The block layout of one call: shapes, liveness and the visible part of each block pair."""

    def __init__(self, qlive: torch.Tensor, klive: torch.Tensor, offset: int, heads: int):
        self.qlive, self.klive, self.offset, self.heads = qlive, klive, offset, heads
        self.tq, self.tk = qlive.shape[1], klive.shape[1]
        self.at = torch.arange(BLOCK, device=qlive.device)

    def key_blocks(self, a: int) -> range:
        """The key blocks query block `a` (its first position) may see: up to the diagonal."""
        last = min(self.tk, a + BLOCK + self.offset)  # keys j <= i + offset for i < a + BLOCK
        return range(0, max(last, 0), BLOCK)

    def visible(self, a: int, c: int) -> torch.Tensor:
        """[B, 1, 1, BLOCK, BLOCK] bool: query a+i sees key c+j."""
        causal = (c + self.at)[None, :] <= (a + self.at + self.offset)[:, None]
        vis = causal[None] & self.qlive[:, a : a + BLOCK, None] & self.klive[:, None, c : c + BLOCK]
        return vis[:, None, None]


class BlockwiseAttention(torch.autograd.Function):
    """softmax(Q K^T * scale + mask) V by blocks (see the module docstring). Inputs, padded to
    whole blocks and zero where dead: q [B, H, G, Tq, d], k and v [B, H, Tk, d] (H key/value
    heads, G query heads per key/value head); qlive [B, Tq], klive [B, Tk] bool."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        qlive: torch.Tensor,
        klive: torch.Tensor,
        offset: int,
        scale: float,
    ) -> torch.Tensor:
        b, h, g, tq, d = q.shape
        n = b * h
        lay = _Blocks(qlive, klive, offset, h)
        v1 = torch.cat([v, v.new_ones(b, h, v.shape[2], 1)], dim=-1).view(n, -1, d + 1)
        kt = k.view(n, -1, d).transpose(1, 2)
        out = torch.empty_like(q)
        lse = q.new_zeros(b, h, g, tq, 1)
        for a in range(0, tq, BLOCK):
            qb = q[:, :, :, a : a + BLOCK].reshape(n, g * BLOCK, d)
            m = q.new_full((b, h, g, BLOCK, 1), float("-inf"))
            total = q.new_zeros(b, h, g, BLOCK, 1)
            acc = q.new_zeros(b, h, g, BLOCK, d)
            for c in lay.key_blocks(a):
                vis = lay.visible(a, c)
                s = torch.bmm(qb, kt[:, :, c : c + BLOCK]).view(b, h, g, BLOCK, BLOCK) * scale
                s = s.masked_fill(~vis, float("-inf"))
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                m_use = m_new.masked_fill(m_new == float("-inf"), 0.0)
                p = torch.exp(s - m_use)
                alpha = torch.exp(m - m_use)
                pv = torch.bmm(p.view(n, g * BLOCK, BLOCK), v1[:, c : c + BLOCK])
                pv = pv.view(b, h, g, BLOCK, d + 1)
                live = vis.any(-1, keepdim=True)  # a row that sees no key here stays as it was
                acc = torch.where(live, acc * alpha + pv[..., :d], acc)
                total = torch.where(live, total * alpha + pv[..., d:], total)
                m = torch.where(live, m_new, m)
            seen = total > 0
            out[:, :, :, a : a + BLOCK] = acc / torch.where(seen, total, 1.0)
            lse[:, :, :, a : a + BLOCK] = torch.where(seen, m + torch.log(total), 0.0)
        ctx.save_for_backward(q, k, v, out, lse, qlive, klive)
        ctx.offset, ctx.scale = offset, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k, v, out, lse, qlive, klive = ctx.saved_tensors
        offset, scale = ctx.offset, ctx.scale
        b, h, g, tq, d = q.shape
        n = b * h
        lay = _Blocks(qlive, klive, offset, h)
        dout = grad_out.masked_fill(~qlive[:, None, None, :, None], 0.0)
        delta = _rowsum((dout * out).view(n, g * tq, d)).view(b, h, g, tq, 1)
        kf, vf = k.view(n, -1, d), v.view(n, -1, d)
        kt, vt = kf.transpose(1, 2), vf.transpose(1, 2)
        dq = torch.zeros_like(q)
        dk = torch.zeros_like(kf)
        dv = torch.zeros_like(vf)
        for a in range(0, tq, BLOCK):
            qb = q[:, :, :, a : a + BLOCK].reshape(n, g * BLOCK, d)
            dob = dout[:, :, :, a : a + BLOCK].reshape(n, g * BLOCK, d)
            lse_b = lse[:, :, :, a : a + BLOCK]
            delta_b = delta[:, :, :, a : a + BLOCK]
            dqb = q.new_zeros(n, g * BLOCK, d)
            for c in lay.key_blocks(a):
                vis = lay.visible(a, c)
                s = torch.bmm(qb, kt[:, :, c : c + BLOCK]).view(b, h, g, BLOCK, BLOCK) * scale
                p = torch.exp(s.masked_fill(~vis, float("-inf")) - lse_b)
                p3 = p.view(n, g * BLOCK, BLOCK)
                dv[:, c : c + BLOCK] += torch.bmm(p3.transpose(1, 2), dob)
                dp = torch.bmm(dob, vt[:, :, c : c + BLOCK]).view(b, h, g, BLOCK, BLOCK)
                ds = (p * (dp - delta_b) * scale).view(n, g * BLOCK, BLOCK)
                dqb += torch.bmm(ds, kf[:, c : c + BLOCK])
                dk[:, c : c + BLOCK] += torch.bmm(ds.transpose(1, 2), qb)
            dq[:, :, :, a : a + BLOCK] = dqb.view(b, h, g, BLOCK, d)
        return dq, dk.view_as(k), dv.view_as(v), None, None, None, None


def blockwise_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention hook for `blockwise`: query [B, Hq, T, d], key and value
    [B, Hkv, K, d] → ([B, T, Hq, d], None), like the eager attention (no weights)."""
    if dropout:
        raise ModelError(
            "--attention blockwise has no attention dropout", "set attention_dropout to 0"
        )
    if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("s_aux") is not None:
        raise ModelError(
            "--attention blockwise supports plain causal attention only (this model uses "
            "a sliding window, softcapping or attention sinks)",
            "use --attention eager or sdpa for this model",
        )
    if attention_mask is not None and not isinstance(attention_mask, BlockwiseMask):
        raise ModelError(
            "--attention blockwise got a prepared attention mask it cannot read",
            "pass a 2D attention mask (1 = real token)",
        )
    b, hq, t, d = query.shape
    hk, kl = key.shape[1], key.shape[2]
    if hq % hk:
        raise ModelError(f"{hq} query heads do not group over {hk} key/value heads", "")
    dtype = query.dtype
    offset = attention_mask.offset if attention_mask is not None else kl - t
    keys = attention_mask.keys if attention_mask is not None else None
    klive = keys if keys is not None else torch.ones(b, kl, dtype=torch.bool, device=key.device)
    if 0 <= offset and offset + t <= kl:
        qlive = klive[:, offset : offset + t]
    else:
        qlive = torch.ones(b, t, dtype=torch.bool, device=query.device)
    tq, tk = -(-t // BLOCK) * BLOCK, -(-kl // BLOCK) * BLOCK
    qlive = F.pad(qlive, (0, tq - t), value=False)
    klive = F.pad(klive, (0, tk - kl), value=False)
    with torch.autocast(device_type=query.device.type, enabled=False):
        q = _padded(query.float(), tq).masked_fill(~qlive[:, None, :, None], 0.0)
        k = _padded(key.float(), tk).masked_fill(~klive[:, None, :, None], 0.0)
        v = _padded(value.float(), tk).masked_fill(~klive[:, None, :, None], 0.0)
        q = q.view(b, hk, hq // hk, tq, d)
        scale = float(scaling) if scaling is not None else d**-0.5
        out = BlockwiseAttention.apply(q, k, v, qlive, klive, offset, scale)
    out = out.view(b, hq, tq, d)[:, :, :t].to(dtype)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def register() -> None:
    """Register `blockwise_attention` and `blockwise_mask` with transformers, once per process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, blockwise_attention)
    if NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(NAME, blockwise_mask)
