"""The output head and a per-position loss on chunks of positions: never a whole [B, T, V].

A long row's logits are the largest tensor of a step: SmolLM2's 49,152-token vocabulary at 8,192
positions is 1.6 GB in float32, and autograd would keep them (and their float32 log-softmax) for
the backward. `by_chunks` runs the head and a per-position function on `HEAD_CHUNK` positions at
a time from the final hidden states, each chunk under non-reentrant checkpointing when it needs a
gradient: a chunk's logits are recomputed in the backward, never kept, so the loss costs memory
for one chunk's logits. Every objective that reads log-probs takes it: SFT, DPO and IPO
(`objectives.sft.chunked_completion_nll`, a completion's NLL sum), GRPO's update (its float64
log-probs at temperature, on the kept positions) and evaluation. The reward model reads one
hidden state per row through a scalar head and makes no vocabulary logits at all.

When a forward takes it (`chunks_head`): under `--attention blockwise` (the long-row mode)
always, otherwise when the positions it runs the head on are more than one chunk. A short row
keeps the whole-logits path: native BLAS may round a row of a product differently when the
product has another number of rows, so a short run writes exactly the bytes it wrote before
chunking existed. Each position's logits and loss are the whole forward's (an output-layer product
per position, a softmax per position): in portable mode the exact products give a position the
same bits in a chunk as in the whole. Not taken where the logits are not the head on the
final-norm hidden states (`CausalLM.plain_head`: batch-invariant rows, a sharded base, steering,
a soft-capped head): those forwards make the whole logits as before.
"""

from __future__ import annotations

from typing import Any

import torch

from twinrun.objectives import chunks

HEAD_CHUNK = chunks.HEAD_CHUNK  # positions per chunk (objectives/chunks.py holds it)
by_chunks = chunks.by_chunks


def chunks_head(model: Any, positions: int) -> bool:
    """Whether a forward whose head runs on `positions` positions (per row, along the chunked
    dimension) runs it by chunks: see the module docstring."""
    if not getattr(model, "plain_head", False):
        return False
    return bool(getattr(model, "chunked_head", False)) or positions > chunks.HEAD_CHUNK


def whole_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Every position's float32 logits [B, T, V] from final hidden states, without a graph:
    what `--diag` records as `forward.logits` of a chunked forward (one copy, nothing kept for
    the backward)."""
    with torch.no_grad(), model.autocast():
        return model.hf.get_output_embeddings()(hidden.detach()).float()


def completion_nll_by_chunks(
    model: Any,
    ids: torch.Tensor,
    attn: torch.Tensor,
    mask: torch.Tensor,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`completion_nll(model(ids, attn), ids, mask)` — per-row NLL sums [B] and counts [B] — from
    the final hidden states by chunks (`chunked_completion_nll`), and with `keep_logits` the whole
    logits (no graph) for `--diag`. A batch-invariant model never comes here (`chunks_head`)."""
    from twinrun.objectives.sft import chunked_completion_nll

    hidden = model.last_hidden(ids, attn)
    head = model.hf.get_output_embeddings()
    sums, counts = chunked_completion_nll(hidden, head, ids, mask, False, model.autocast)
    return sums, counts, whole_logits(model, hidden) if keep_logits else None
