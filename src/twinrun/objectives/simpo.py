"""SimPO (Meng et al., 2024, "SimPO: Simple Preference Optimization with a Reference-Free
Reward"): the pure loss, no model.

For a pair with policy log-probs pc (chosen) and pr (rejected) — each the completion's log-prob
per token (length-normalised: the recipe divides each sum by its completion tokens) — and no
reference model:

    z      = beta * (pc - pr) - gamma        (gamma: the target reward margin, `--gamma`)
    loss   = -log sigmoid(z) = log(1 + exp(-z))
    r_c    = beta * pc,  r_r = beta * pr     (the implicit rewards)

This is TRL's `CPOTrainer(loss_type="simpo", cpo_alpha=0.0)`: `-logsigmoid(beta * (pc - pr -
gamma / beta))`. The batch loss is the mean over the pairs. Metrics: reward margin =
mean(beta * (pc - pr)), accuracy = fraction of pairs with r_c > r_r. Gradient:
d loss / d pc = -beta * sigmoid(-z) < 0 (the chosen side is pushed up, the rejected down).

Worked example: pc = -1, pr = -2, beta = 2, gamma = 1 gives z = 2 * 1 - 1 = 1 and
loss = log(1 + e^-1) = 0.31326168751822286.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinrun.objectives.dpo import DPOOut, check_pair_logprobs

__all__ = ["simpo_loss"]


def simpo_loss(
    policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, beta: float, gamma: float
) -> DPOOut:
    """SimPO over P pairs; each argument a [P] tensor of per-token log-probs (see module doc)."""
    if not gamma >= 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    pc, pr, _, _ = check_pair_logprobs(
        policy_chosen, policy_rejected, policy_chosen, policy_rejected, beta
    )
    chosen_rewards = (beta * pc).detach()
    rejected_rewards = (beta * pr).detach()
    z = beta * (pc - pr) - gamma
    losses = -F.logsigmoid(z)
    return DPOOut(
        losses=losses,
        loss=losses.mean(),
        reward_margin=(chosen_rewards - rejected_rewards).mean(),
        accuracy=(chosen_rewards > rejected_rewards).to(z.dtype).mean(),
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
    )
