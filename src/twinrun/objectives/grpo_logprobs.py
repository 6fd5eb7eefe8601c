"""GRPO's log-probabilities of the sampled tokens, in float64, from float32 logits: at the kept
(trained) positions only, a few rows at a time, each chunk recomputed in the backward, so no
[K, V] float64 tensor is kept. The loss (`objectives/grpo.py`) takes these as `logp`."""

from __future__ import annotations

import torch

LOGPROB_CHUNK = 64  # kept positions per float64 log-softmax of `kept_logprobs`


def kept_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[N, W-1] float64 logprobs of the predicted tokens `ids[:, 1:]`: at each kept position
    `log_softmax(logits.double() / T)` of its token, 0 elsewhere (the loss reads kept positions
    only); `rows_logprobs` on the kept positions' rows of the whole [N, W, V] `logits`."""
    return rows_logprobs(logits[kept_at(kept)], ids, kept, temperature)


def kept_at(kept: torch.Tensor) -> torch.Tensor:
    """[N, W] bool: the positions whose logits predict a kept token (position t predicts
    ids[:, t + 1]; the last position predicts nothing)."""
    return torch.cat([kept, torch.zeros_like(kept[:, :1])], dim=1)


def rows_logprobs(
    rows: torch.Tensor, ids: torch.Tensor, kept: torch.Tensor, temperature: float
) -> torch.Tensor:
    """`kept_logprobs` from the kept positions' logits alone (`rows` [K, V], row-major order),
    placed at the kept positions (`picked_rows` makes them)."""
    out = torch.zeros(kept.shape, dtype=torch.float64, device=rows.device)
    return out.masked_scatter(kept, picked_rows(rows, ids[:, 1:][kept], temperature))


def picked_rows(rows: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[K] float64 `log_softmax(rows.float().double() / T)` at `targets`. The float64
    log-softmax runs over the kept rows only — the prompt and capped positions, most of a row,
    are never converted — `LOGPROB_CHUNK` rows at a time, each chunk under non-reentrant
    checkpointing: no [K, V] float64 tensor is made or kept for the backward (a long multi-turn
    row keeps hundreds of positions), only the kept rows' float32 logits. The softmax is per
    position, so each value, and its gradient, is the one a log-softmax over every position
    gives, bit for bit."""
    rows = rows.float()
    picked = [
        chunk_logprobs(part, target, temperature)
        for part, target in zip(
            torch.split(rows, LOGPROB_CHUNK), torch.split(targets, LOGPROB_CHUNK), strict=True
        )
    ]
    return torch.cat(picked)


def chunk_logprobs(rows: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """`log_softmax(rows.double() / T)` at `targets` ([C] float64), recomputed in the backward
    when `rows` needs a gradient (its [C, V] float64 tensors live only while a chunk runs; it
    draws nothing, so no generator state is kept for the recompute)."""
    if not rows.requires_grad:
        return picked_logprobs(rows, targets, temperature)
    from torch.utils.checkpoint import checkpoint

    out = checkpoint(
        picked_logprobs, rows, targets, temperature, use_reentrant=False, preserve_rng_state=False
    )
    assert isinstance(out, torch.Tensor)
    return out


def picked_logprobs(rows: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The float64 log-softmax of `rows / T` [C, V] at `targets` [C]."""
    logp = torch.log_softmax(rows.double() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
