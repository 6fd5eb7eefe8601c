"""Identity Preference Optimisation (Azar et al., 2023, "A General Theoretical Paradigm to
Understand Learning from Human Preferences", eq. 17): the pure loss, no model.

For a pair with policy log-probs pc (chosen), pr (rejected) and reference log-probs rc, rr (the
same model with the adapter disabled) — each the completion's log-prob per token, as TRL's
`DPOTrainer(loss_type="ipo")` takes them (the recipe divides each sum by its token count):

    h      = (pc - rc) - (pr - rr)
    loss   = (h - 1 / (2 * tau))^2           (tau is `--beta`)

IPO regresses the log-ratio gap onto 1/(2 tau) instead of pushing it to infinity as DPO's
logistic loss does. The batch loss is the mean over the pairs. Metrics as DPO's (`DPOOut`):
chosen/rejected rewards tau * (p - r), reward margin = mean(tau * h), accuracy = fraction of
pairs with h > 0. Gradient: d loss / d pc = 2 (h - 1/(2 tau)), negative while the gap is short of
its target. Reference log-probs are detached.

Worked example: pc - rc = 1, pr - rr = -1, tau = 0.1 gives h = 2, 1/(2 tau) = 5 and
loss = (2 - 5)^2 = 9.
"""

from __future__ import annotations

import torch

from twinrun.objectives.dpo import DPOOut, check_pair_logprobs

__all__ = ["ipo_loss"]


def ipo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> DPOOut:
    """IPO over P pairs; each argument is a [P] tensor of per-token log-probs, `beta` is tau."""
    pc, pr, rc, rr = check_pair_logprobs(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta
    )
    h = (pc - rc) - (pr - rr)
    losses = (h - 1.0 / (2.0 * beta)) ** 2
    chosen_rewards = (beta * (pc - rc)).detach()
    rejected_rewards = (beta * (pr - rr)).detach()
    return DPOOut(
        losses=losses,
        loss=losses.mean(),
        reward_margin=(beta * h).detach().mean(),
        accuracy=(h.detach() > 0).to(h.dtype).mean(),
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
    )
