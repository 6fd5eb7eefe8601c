"""Reward modelling: last-token pooling and the Bradley-Terry pairwise loss (pure maths, no head).

The reward model scores a sequence by a scalar linear head on the hidden state of its last real
token. With right padding (docs/batching.md) and attention mask a_t (1 on real tokens, then 0s):

    last(row)  = sum_t a_t - 1                   (index of the last real token)
    pooled     = hidden[row, last(row), :]       ([H]; a gather, so exact and batch-independent)

Bradley-Terry: the probability that the chosen answer beats the rejected one is
sigmoid(s_c - s_r). For P pairs with scores s_c, s_r:

    d_i        = s_c,i - s_r,i
    loss       = mean_i -log sigmoid(d_i) = mean_i log(1 + exp(-d_i))
    accuracy   = fraction of pairs with d_i > 0 (a tie counts as wrong)
    margin     = mean_i d_i

d loss / d s_c,i = -sigmoid(-d_i) / P < 0: training raises the chosen score.

Worked example: s_c = [3, 0], s_r = [1, 1] gives d = [2, -1],
loss = (log(1 + e^-2) + log(1 + e)) / 2 = 0.72009484928..., accuracy 0.5, margin 0.5.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["BTOut", "bradley_terry_loss", "last_token_index", "pool_last"]


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token ([B,T] right-padded mask -> [B] int64).

    Raises ValueError if a row has no real token or is not right-padded (a 0 before a 1)."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, T], got shape {tuple(attention_mask.shape)}")
    m = attention_mask.to(torch.int64)
    if bool(((m != 0) & (m != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    lengths = m.sum(dim=1)
    if bool((lengths == 0).any()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} have no real token")
    if m.shape[1] > 1 and bool((m[:, 1:] > m[:, :-1]).any()):
        rows = (m[:, 1:] > m[:, :-1]).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows} are not right-padded (a padded position before a real one)")
    return lengths - 1


def pool_last(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The hidden state of each row's last real token: [B,T,H] -> [B,H] (same dtype)."""
    if hidden.dim() != 3 or hidden.shape[:2] != attention_mask.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} must be [B, T, H] with [B, T] = "
            f"attention_mask {tuple(attention_mask.shape)}"
        )
    idx = last_token_index(attention_mask).to(hidden.device)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]


class BTOut(NamedTuple):
    """What `bradley_terry_loss` returns. Only `losses` and `loss` carry gradients."""

    losses: torch.Tensor  # [P] per-pair -logsigmoid(s_c - s_r)
    loss: torch.Tensor  # scalar, mean of losses
    accuracy: torch.Tensor  # scalar, fraction with s_c > s_r, detached
    margin: torch.Tensor  # scalar, mean of s_c - s_r, detached


def bradley_terry_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> BTOut:
    """Bradley-Terry over P pairs of scalar scores ([P] each); half precision is upcast to f32."""
    if chosen_scores.dim() != 1 or chosen_scores.shape[0] == 0:
        raise ValueError(
            f"scores must be a non-empty [P] tensor, got shape {tuple(chosen_scores.shape)}"
        )
    if rejected_scores.shape != chosen_scores.shape:
        raise ValueError(
            f"rejected_scores {tuple(rejected_scores.shape)} must match "
            f"chosen_scores {tuple(chosen_scores.shape)}"
        )
    c = chosen_scores.to(torch.promote_types(chosen_scores.dtype, torch.float32))
    r = rejected_scores.to(torch.promote_types(rejected_scores.dtype, torch.float32))
    d = c - r
    losses = -F.logsigmoid(d)
    dd = d.detach()
    return BTOut(
        losses=losses,
        loss=losses.mean(),
        accuracy=(dd > 0).to(dd.dtype).mean(),
        margin=dd.mean(),
    )
