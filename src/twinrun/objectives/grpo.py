"""GRPO loss: the PPO-clip surrogate on group-relative advantages, token-summed over a fixed
denominator.

What is computed. For completion row i (one sampled completion of one prompt) with advantage A_i
(already group-normalised, batch-normalised and clipped: `twinrun.rl.advantages`), optional row
weight w_i (prioritized-replay importance weight; 1 when absent), and each completion token t kept
by the token-capped mask m_{i,t}:

    rho_{i,t}  = exp(logp_{i,t} - old_logp_{i,t})              (old_logp: float64, from sampling)
    l_{i,t}    = -min(rho_{i,t} * A_i, clip(rho_{i,t}, 1 - eps, 1 + eps) * A_i)
    loss       = sum_{i,t} m_{i,t} * w_i * l_{i,t} / D

D (`denominator`) is the number of token-capped active tokens across the *whole optimizer batch*,
not of this forward — so a batch split into several forwards gives per-forward losses that sum
(and whose gradients sum) to the loss of one big forward. logp is the current policy's logprob of
the sampled token (the caller computes it at temperature 1 over the same logits the sampler saw,
or however it computed old_logp — the two must match for rho = 1 on the first update).

A token is "clipped" when the clipped branch is the minimum and is flat there
(rho > 1 + eps with A > 0, or rho < 1 - eps with A < 0): it contributes the constant
-clip(rho) * A and no gradient. `clip_fraction` is the share of active tokens that are clipped.

Precision: logp is upcast to float64 and the whole surrogate is computed in float64 (old logprobs
and advantages are float64); the returned loss is a float64 scalar tensor whose gradient flows back
into logp in logp's own dtype. Masked positions are set to log-ratio 0 *before* exp, so padding
values (even -inf) never produce inf/NaN in the forward or the gradient.

What is left out, on purpose: no KL penalty and no reference model (beta = 0), no entropy bonus,
no value function / critic (the group baseline replaces it), no per-sequence length normalisation
(tokens are summed, then divided by the batch-wide token count D), and no dual-clip.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GRPOLossOut:
    """The loss and its diagnostics for one forward.

    `loss` is differentiable (float64, scalar). `clipped_tokens` / `active_tokens` let a caller
    that splits a step into several forwards aggregate `clip_fraction` exactly; `ratio_sum` does
    the same for `ratio_mean`.
    """

    loss: torch.Tensor
    row_losses: torch.Tensor  # [N]: each row's share of `loss` (its tokens' sum / denominator)
    clip_fraction: float
    ratio_mean: float
    clipped_tokens: int
    active_tokens: int
    ratio_sum: float


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    denominator: int,
    clip_eps: float,
    row_weights: torch.Tensor | None = None,
    kl: tuple[float, torch.Tensor] | None = None,
) -> GRPOLossOut:
    """PPO-clip surrogate summed over active tokens and divided by `denominator`.

    logprobs [N, T] (float32 or float64, current policy, requires grad), old_logprobs [N, T]
    float64, advantages [N] float64, mask [N, T] bool (token-capped), denominator >= 1 (kept tokens
    in the whole optimizer batch), clip_eps > 0, row_weights [N] float64 or None. `kl`: (beta,
    the reference's logprobs [N, T] float64): each active token's loss gains
    `beta * (exp(ref - logp) - (ref - logp) - 1)`, the k3 estimate of KL(policy || reference)
    TRL's GRPO adds (before the row weight).
    """
    _check_shapes(logprobs, old_logprobs, mask, advantages, row_weights)
    _check_numbers(denominator, clip_eps)
    if kl is not None and kl[1].shape != logprobs.shape:
        raise ValueError(f"ref_logprobs {tuple(kl[1].shape)} must have the [N, T] shape")

    f64 = torch.float64
    active = mask.bool()
    zero = torch.zeros((), dtype=f64, device=logprobs.device)
    log_ratio = torch.where(active, logprobs.to(f64) - old_logprobs.to(f64), zero)
    ratio = torch.exp(log_ratio)
    adv = advantages.to(f64).unsqueeze(1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if kl is not None:
        beta, ref = kl
        gap = torch.where(active, ref.to(f64) - logprobs.to(f64), zero)
        per_token = per_token + beta * (torch.exp(gap) - gap - 1.0)
    if row_weights is not None:
        per_token = per_token * row_weights.to(f64).unsqueeze(1)
    per_token = torch.where(active, per_token, zero)
    row_sums = per_token.sum(dim=1)  # per row, then over rows: no thread count splits the sum
    loss = row_sums.sum() / denominator
    row_losses = row_sums / denominator

    n_clipped, n_active, ratio_sum = _clip_counts(ratio, adv, active, zero, clip_eps)
    return GRPOLossOut(
        loss=loss,
        row_losses=row_losses,
        clip_fraction=n_clipped / n_active if n_active else 0.0,
        ratio_mean=ratio_sum / n_active if n_active else 1.0,
        clipped_tokens=n_clipped,
        active_tokens=n_active,
        ratio_sum=ratio_sum,
    )


def _check_shapes(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    row_weights: torch.Tensor | None,
) -> None:
    """A ValueError for the first of `grpo_loss`'s tensors whose shape is wrong."""
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same [N, T] shape"
        )
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [N, T], got {tuple(logprobs.shape)}")
    n = logprobs.shape[0]
    if advantages.shape != (n,):
        raise ValueError(f"advantages must be [{n}], got {tuple(advantages.shape)}")
    if row_weights is not None and row_weights.shape != (n,):
        raise ValueError(f"row_weights must be [{n}], got {tuple(row_weights.shape)}")


def _check_numbers(denominator: int, clip_eps: float) -> None:
    """A ValueError when `grpo_loss`'s token denominator or clip epsilon is out of range."""
    if isinstance(denominator, bool) or not isinstance(denominator, int) or denominator < 1:
        raise ValueError(f"denominator must be an integer >= 1, got {denominator!r}")
    if not clip_eps > 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")


def _clip_counts(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    active: torch.Tensor,
    zero: torch.Tensor,
    clip_eps: float,
) -> tuple[int, int, float]:
    """The diagnostics (no gradient): clipped active tokens, active tokens, and the sum of the
    active tokens' ratios (per row, then over rows)."""
    with torch.no_grad():
        is_clipped = ((ratio > 1.0 + clip_eps) & (adv > 0)) | ((ratio < 1.0 - clip_eps) & (adv < 0))
        n_clipped = int((is_clipped & active).sum().item())
        n_active = int(active.sum().item())
        ratio_sum = float(torch.where(active, ratio, zero).sum(dim=1).sum().item())
    return n_clipped, n_active, ratio_sum
