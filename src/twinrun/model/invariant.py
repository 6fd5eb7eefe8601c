"""Batch-invariant mode for `CausalLM` (`--batch-invariant`): a row's numbers do not depend on
the batch it rode in.

How. A forward without a KV cache runs packed when it can (`twinrun.model.packing`, `run_packed`:
every trainable parameter a LoRA factor, no sliding window shorter than a row): the rows' real
tokens end to end, linear layers on fixed-shape chunks of tokens, attention per row over its own
keys, LoRA weight gradients per row. Otherwise every row runs on its own, cut to its real length
(the forward a batch of one gives it). Either way every matmul, softmax, norm and reduction a row
goes through has shapes that do not depend on the other rows, nothing is reduced across rows, and
a batch of one runs the same code: on a given device, library and thread count a row's logits,
hidden states and gradients are the same bits at any batch size. The results are right-padded
with zeros to the batch's width (padded positions are never read by a loss). A row's LoRA
dropout mask is its own too (`twinrun.model.dropout`: keyed by the row, whichever way it runs).

Gradients. Autograd adds the gradients a parameter receives from several rows in the order its
scheduler reaches them (last row first, in practice), so a batch of four and four batches of one
would add the same four row gradients in different orders. While gradients are recorded, each row
therefore reads the trainable parameters through its own alias (`RowAliases`). The aliases'
backward only collects; at the end of the backward pass the rows' gradients are added into
`.grad` in a canonical order: row index by row index, and for one row index the gradients of the
forwards that ran in that backward (a pair's chosen and rejected forwards) summed first, then
added. That is exactly what a run at batch size 1 does — one forward (or one pair's two forwards)
per backward, autograd summing a parameter's uses before adding them to `.grad` — so a
batch-invariant run at batch size B and accumulation A writes the bytes of a run at batch size 1
and accumulation A·B. The gradients are written into `.grad` directly (post-accumulate-grad hooks
run once per backward, as usual), so `torch.autograd.grad` does not see them. One backward at a
time: the collected gradients are module state.

Cost (bench/batch_invariant.py): packing keeps one forward per batch; what remains is per-call
overhead (chunked linears, the per-row attention's gathers and eager softmax, the per-row LoRA
weight gradients: a gather into slots and a batched matmul per factor).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from twinrun.model.dropout import one_row, packed_rows
from twinrun.model.output import ModelOutput, RowModel
from twinrun.model.row_gradients import collect, new_forward
from twinrun.objectives.sft import BATCH_INVARIANT_TAG

Trainable = list[tuple[nn.Module, str, nn.Parameter]]


class RowAliases(torch.autograd.Function):
    """One alias of every trainable parameter per row (see the module docstring).

    `RowAliases.apply(rows, params, anchor)`: the parameters come in as a tuple, not as tensor
    inputs, so autograd never routes a gradient (nor an empty one) to their own accumulators;
    `anchor` is a fresh scalar that requires grad, which makes the aliases differentiable. Backward
    hands the rows' gradients to `row_gradients.collect` and returns nothing."""

    @staticmethod
    def forward(
        ctx: Any, rows: int, params: tuple[torch.Tensor, ...], anchor: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.leaves = params
        ctx.rows = rows
        ctx.order = new_forward()
        ctx.set_materialize_grads(False)
        return tuple(p.detach() for _ in range(rows) for p in params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, None, None]:
        n = len(ctx.leaves)
        for row in range(ctx.rows):
            collect(row, ctx.order, ctx.leaves, grads[row * n : (row + 1) * n])
        return None, None, None


def row_aliases(rows: int, params: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """`rows` aliases of each of `params`, row-major (row 0's aliases first)."""
    anchor = torch.zeros((), device=params[0].device, requires_grad=True)
    return RowAliases.apply(rows, params, anchor)


def real_lengths(attention_mask: torch.Tensor | None, b: int, t: int) -> list[int]:
    """Each row's number of real tokens; rows must be right-padded and non-empty."""
    if attention_mask is None:
        return [t] * b
    mask = attention_mask != 0
    lengths = mask.sum(dim=1)
    expected = torch.arange(t, device=mask.device)[None, :] < lengths[:, None]
    if not torch.equal(mask, expected):
        raise ValueError("batch-invariant mode needs right-padded rows (1s, then 0s)")
    out = [int(n) for n in lengths.tolist()]
    if 0 in out:
        raise ValueError(f"row {out.index(0)} has no real token")
    return out


def trainable_parameters(modules: Iterable[nn.Module]) -> Trainable:
    """(module, name, parameter) for every parameter of `modules` (a model's `modules()`) that
    requires grad, in module order."""
    return [
        (mod, name, p)
        for mod in modules
        for name, p in mod._parameters.items()
        if p is not None and p.requires_grad
    ]


@contextmanager
def swapped(trainable: Trainable, aliases: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """Inside the block each trainable parameter is read through its alias."""
    if not aliases:
        yield
        return
    for (mod, name, _), alias in zip(trainable, aliases, strict=True):
        mod._parameters[name] = alias  # type: ignore[assignment]  # a tensor alias of the parameter
    try:
        yield
    finally:
        for mod, name, param in trainable:
            mod._parameters[name] = param


def run_rows(
    model: RowModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    hidden_layer: int | None,
    steer: tuple[int, torch.Tensor] | None,
) -> ModelOutput:
    """Every row alone at its real length (`model.run_batch`), results right-padded with 0."""
    b, t = input_ids.shape
    lengths = real_lengths(attention_mask, b, t)
    modules = list(model.modules())  # walked once per forward
    trainable = trainable_parameters(modules) if torch.is_grad_enabled() else []
    if packable(model, modules, trainable, max(lengths)):
        linears = [m for m in modules if isinstance(m, nn.Linear)]
        return run_packed(model, input_ids, lengths, hidden_layer, steer, linears)
    aliases: tuple[torch.Tensor, ...] = ()
    if trainable:
        aliases = row_aliases(b, tuple(p for _, _, p in trainable))
    k = len(trainable)
    logits, hidden = [], []
    for row, length in enumerate(lengths):
        with swapped(trainable, aliases[row * k : (row + 1) * k]), one_row(row):
            out = model.run_batch(
                input_ids[row : row + 1, :length], None, None, hidden_layer, steer
            )
        logits.append(F.pad(out.logits, (0, 0, 0, t - length)))
        if out.hidden is not None:
            hidden.append(F.pad(out.hidden, (0, 0, 0, t - length)))
    result = ModelOutput(torch.cat(logits), torch.cat(hidden) if hidden else None)
    setattr(result.logits, BATCH_INVARIANT_TAG, True)
    return result


def packable(model: RowModel, modules: list[nn.Module], trainable: Trainable, longest: int) -> bool:
    """Whether `run_packed` can run this forward: every trainable parameter is a LoRA factor
    (used by `F.linear` alone, without a bias), no sliding window is shorter than a row, and the
    model is on the CPU. The packed path's promise rests on a row's bits not depending on how many
    chunks or rows share a batched matmul, which holds for the CPU kernels (tested); cuBLAS picks
    its kernel by the batch count, and on an H200 the packed losses moved between batch sizes, so
    on CUDA every row runs as its own forward."""
    from twinrun.model.lora import LoRALinear

    hf = getattr(model, "hf", None)
    if hf is None or hf.device.type != "cpu":
        return False
    window = getattr(hf.config, "sliding_window", None)
    if window is not None and window < longest:
        return False
    lora = {
        id(factor.weight)
        for m in modules
        if isinstance(m, LoRALinear)
        for factor in (m.lora_A, m.lora_B)
    }
    return all(id(p) in lora for _, _, p in trainable)


def run_packed(
    model: RowModel,
    input_ids: torch.Tensor,
    lengths: list[int],
    hidden_layer: int | None,
    steer: tuple[int, torch.Tensor] | None,
    linears: list[nn.Linear],
) -> ModelOutput:
    """The rows' real tokens as one packed sequence (`twinrun.model.packing`; `linears`: the
    model's `nn.Linear` layers), results right-padded with 0."""
    from twinrun.model.packing import pack, packed, plan_for, unpack

    b, t = input_ids.shape
    plan = plan_for(lengths, input_ids.device)
    ids, positions, flat = pack(input_ids, plan)
    hf = model.hf  # type: ignore[attr-defined]  # packable() checked that the model has .hf
    with packed(hf, plan, new_forward(), linears), packed_rows(plan.starts, plan.lengths):
        out = model.run_batch(ids, None, None, hidden_layer, steer, positions)
    hidden = unpack(out.hidden, flat, b, t) if out.hidden is not None else None
    result = ModelOutput(unpack(out.logits, flat, b, t), hidden)
    setattr(result.logits, BATCH_INVARIANT_TAG, True)
    return result


def rowwise(module: nn.Module, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """`module` applied to each row's tensor on its own, each row with its own parameter aliases
    (for a trainable module outside the model, e.g. the reward head)."""
    trainable = trainable_parameters(module.modules()) if torch.is_grad_enabled() else []
    aliases: tuple[torch.Tensor, ...] = ()
    if trainable:
        aliases = row_aliases(len(rows), tuple(p for _, _, p in trainable))
    k = len(trainable)
    out = []
    for row, x in enumerate(rows):
        with swapped(trainable, aliases[row * k : (row + 1) * k]):
            out.append(module(x))
    return out


def last_token_scores(
    norm: nn.Module, head: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The reward model's [B] float32 scores in batch-invariant mode: per row, the final norm
    over the row's real positions ([1, L, H], as a batch of one has them), its last token, then
    the head — each row alone."""
    b, t = attention_mask.shape
    lengths = real_lengths(attention_mask, b, t)
    pooled = [norm(hidden[row : row + 1, :n])[:, -1].float() for row, n in enumerate(lengths)]
    return torch.cat(rowwise(head, pooled)).squeeze(-1)
