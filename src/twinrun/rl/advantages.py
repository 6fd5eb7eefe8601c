"""GRPO advantages and the token cap, in float64, with order-independent sums.

For rewards r[p, g] of prompt p's group of G completions (P prompts per step):

    1. group:  a[p, g] = (r[p, g] - mean_g r[p, :]) / (std_g r[p, :] + eps)
               std is the *population* std (divide by G, `unbiased=False`). A group whose rewards
               are all equal (max == min) gets advantage exactly 0 for every member — it carries no
               learning signal; `zero_adv_group_fraction` is the fraction of such groups.
    2. batch:  b = (a - mean(a)) / (std(a) + eps) over all P*G values (population std). When every
               a is exactly 0 the step has no signal and b stays all zeros (no division).
               Because every group mean of `a` is 0 up to rounding, mean(a) is ~0; it is subtracted
               anyway, so members of an all-equal group may carry a rounding-sized value after this
               stage (a few ulps of 1e-16) when other groups do have signal.
    3. clip:   c = clamp(b, -clip, +clip).

Every mean and sum of squares is `math.fsum` (correctly rounded), so the advantages are the same
bits whatever the thread count, tensor layout or order of the rows; the only other operations are
single IEEE-754 subtract/divide/sqrt, which are exact-rounded everywhere.

The token cap keeps, per completion row, at most `cap` completion tokens (the first ones) in the
loss; the loss denominator is the number of tokens kept across the whole optimizer batch (at
least 1), so a batch split into several forwards sums to the same loss.
"""

from __future__ import annotations

import math

import torch

from twinrun.core.errors import ConfigError

DEFAULT_EPS = 1e-6


def _check_rewards(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2 or rewards.shape[0] < 1 or rewards.shape[1] < 1:
        raise ValueError(
            f"rewards must be [prompts, group] with both >= 1, got {tuple(rewards.shape)}"
        )
    if rewards.dtype != torch.float64:
        raise TypeError(f"rewards must be float64, got {rewards.dtype}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite")


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Population mean and std with correctly rounded (order-independent) sums."""
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) * (v - mean) for v in values) / n
    return mean, math.sqrt(var)


def group_advantages(rewards: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """(r - group mean) / (group population std + eps) per row of `rewards` [P, G] float64.

    Returns [P, G] float64 on the CPU. A group with all-equal rewards gets exactly 0 (see the
    module docstring).
    """
    _check_rewards(rewards)
    out: list[list[float]] = []
    for group in rewards.tolist():
        if max(group) == min(group):
            out.append([0.0] * len(group))
            continue
        mean, std = _mean_std(group)
        if std + eps == 0.0:  # spread so small the variance underflowed (and eps = 0)
            out.append([0.0] * len(group))
            continue
        out.append([(r - mean) / (std + eps) for r in group])
    return torch.tensor(out, dtype=torch.float64)


def batch_normalise(adv: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """(a - mean) / (population std + eps) over every value of `adv` (any shape, float64).

    If every value is exactly 0 the result is all zeros (nothing to normalise); likewise when
    std + eps is 0. Returns a CPU float64 tensor of `adv`'s shape.
    """
    flat = adv.reshape(-1).tolist()
    if all(v == 0.0 for v in flat):
        return torch.zeros_like(adv, dtype=torch.float64)
    mean, std = _mean_std(flat)
    if std + eps == 0.0:  # every value equal: centred, they are all 0
        return torch.zeros_like(adv, dtype=torch.float64)
    normed = [(v - mean) / (std + eps) for v in flat]
    return torch.tensor(normed, dtype=torch.float64).reshape(adv.shape)


def clip_advantages(adv: torch.Tensor, clip: float) -> torch.Tensor:
    """`adv` clamped to [-clip, +clip]; `clip` must be > 0 (math.inf disables clipping)."""
    if not clip > 0:
        raise ConfigError(f"advantage clip must be > 0, got {clip}", "e.g. --advantage-clip 5.0")
    return adv.clamp(-clip, clip)


def zero_advantage_group_fraction(rewards: torch.Tensor) -> float:
    """Fraction of groups (rows of `rewards` [P, G]) whose rewards are all equal."""
    _check_rewards(rewards)
    groups = rewards.tolist()
    return sum(1 for g in groups if max(g) == min(g)) / len(groups)


def compute_advantages(
    rewards: torch.Tensor, clip: float, eps: float = DEFAULT_EPS
) -> tuple[torch.Tensor, float]:
    """Group-normalise, batch-normalise, clip. Returns (advantages [P, G] float64,
    zero_adv_group_fraction)."""
    if not clip > 0:
        raise ConfigError(f"advantage clip must be > 0, got {clip}", "e.g. --advantage-clip 5.0")
    grouped = group_advantages(rewards, eps)
    adv = clip_advantages(batch_normalise(grouped, eps), clip)
    return adv, zero_advantage_group_fraction(rewards)


def apply_token_cap(
    completion_mask: torch.Tensor, cap: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Keep at most `cap` completion tokens per row (the first ones, in position order).

    `completion_mask` is [N, T] bool (True on completion tokens that enter the loss).
    Returns (mask [N, T] bool, per_row_counts [N] int64, denominator) where denominator is the
    total number of kept tokens, at least 1 (so an all-empty batch divides by 1, giving loss 0).
    """
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ConfigError(f"token cap must be an integer >= 1, got {cap!r}", "e.g. --token-cap 64")
    if completion_mask.dim() != 2:
        raise ValueError(f"completion mask must be [N, T], got {tuple(completion_mask.shape)}")
    mask = completion_mask.bool()
    rank = torch.cumsum(mask.to(torch.int64), dim=1)  # 1-based rank of each active token
    kept = mask & (rank <= cap)
    counts = kept.sum(dim=1, dtype=torch.int64)
    denominator = max(1, int(counts.sum().item()))
    return kept, counts, denominator
