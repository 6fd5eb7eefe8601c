"""Direct Preference Optimization (Rafailov et al., 2023): the pure loss, no model.

Sequence log-probability. For a row with tokens x_0..x_{T-1} and loss mask m_t (1 where x_t is
a completion token, the eos included), with the same shift as objectives/sft.py (the logits at
position t-1 predict token t):

    logp(row) = sum_{t=1}^{T-1} m_t * log softmax(logits_{t-1})[x_t]

Logits are upcast to float32 before the log-softmax; the result is float32. It is bitwise
`-completion_nll(...)[0]`, so SFT and DPO agree on what a completion's probability is —
including in batch-invariant mode (`batch_invariant`, as in objectives/sft.py: each row summed over
its own span, so its bits do not depend on the padded width or the batch).

DPO loss. For a pair with policy log-probs pc (chosen), pr (rejected) and reference log-probs
rc, rr (the same model with the adapter disabled):

    z      = beta * ((pc - rc) - (pr - rr))
    loss   = -log sigmoid(z)  = log(1 + exp(-z))
    r_c    = beta * (pc - rc)           (implicit reward of the chosen side)
    r_r    = beta * (pr - rr)           (implicit reward of the rejected side)

The batch loss is the mean of the per-pair losses. Metrics: reward margin = mean(z), accuracy =
fraction of pairs with r_c > r_r. Gradients: d loss / d pc = -beta * sigmoid(-z) < 0 and
d loss / d pr = +beta * sigmoid(-z) > 0 — the policy is pushed towards the chosen completion
and away from the rejected one. Reference log-probs are detached (they are constants).

Worked example: pc - rc = 1, pr - rr = -1, beta = 0.5 gives z = 1 and
loss = -log sigmoid(1) = log(1 + e^-1) = 0.31326168751822286.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from twinrun.objectives.sft import row_sums, wants_invariant

__all__ = ["DPOOut", "check_pair_logprobs", "dpo_loss", "sequence_logprob"]


def sequence_logprob(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    batch_invariant: bool | None = None,
) -> torch.Tensor:
    """Per-row sum of completion-token log-probs: logits [B,T,V], ids [B,T], mask [B,T] -> [B].

    float32 whatever the logits' dtype. Masked-out positions (prompt, padding) contribute an
    exact zero, whatever their logits are. `batch_invariant`: see objectives/sft.py (None follows
    the logits)."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got shape {tuple(logits.shape)}")
    b, t, v = logits.shape
    if input_ids.shape != (b, t) or loss_mask.shape != (b, t):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and loss_mask {tuple(loss_mask.shape)} "
            f"must both be [B, T] = {(b, t)}"
        )
    shift_logits = logits[:, :-1].float().reshape(-1, v)
    targets = input_ids[:, 1:].reshape(-1)
    mask = loss_mask[:, 1:].bool()
    # cross_entropy (not log_softmax + gather) so the bits equal objectives/sft.py's NLL.
    nll = F.cross_entropy(shift_logits, targets, reduction="none").view(b, t - 1)
    nll = torch.where(mask, nll, torch.zeros((), dtype=nll.dtype, device=nll.device))
    return -row_sums(nll, mask, wants_invariant(logits, batch_invariant))


class DPOOut(NamedTuple):
    """What `dpo_loss` returns. Only `losses` and `loss` carry gradients."""

    losses: torch.Tensor  # [P] per-pair -logsigmoid(z)
    loss: torch.Tensor  # scalar, mean of losses
    reward_margin: torch.Tensor  # scalar, mean of z = beta*((pc-rc)-(pr-rr)), detached
    accuracy: torch.Tensor  # scalar, fraction of pairs with chosen reward > rejected, detached
    chosen_rewards: torch.Tensor  # [P] beta*(pc-rc), detached
    rejected_rewards: torch.Tensor  # [P] beta*(pr-rr), detached


def _as_float(x: torch.Tensor) -> torch.Tensor:
    """Upcast half/bfloat16 to float32; keep float32/float64 as they are."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def check_pair_logprobs(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four [P] log-prob tensors of a preference loss, checked (beta > 0, one non-empty
    shape) and upcast to float32; the reference ones detached."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    shape = policy_chosen.shape
    if policy_chosen.dim() != 1 or shape[0] == 0:
        raise ValueError(f"log-probs must be a non-empty [P] tensor, got shape {tuple(shape)}")
    for name, x in (
        ("policy_rejected", policy_rejected),
        ("ref_chosen", ref_chosen),
        ("ref_rejected", ref_rejected),
    ):
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    pc, pr = _as_float(policy_chosen), _as_float(policy_rejected)
    return pc, pr, _as_float(ref_chosen).detach(), _as_float(ref_rejected).detach()


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> DPOOut:
    """DPO over P pairs; each argument is a [P] tensor of sequence log-probs (see module doc)."""
    pc, pr, rc, rr = check_pair_logprobs(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta
    )
    chosen_logratio = pc - rc
    rejected_logratio = pr - rr
    z = beta * (chosen_logratio - rejected_logratio)
    losses = -F.logsigmoid(z)
    chosen_rewards = (beta * chosen_logratio).detach()
    rejected_rewards = (beta * rejected_logratio).detach()
    return DPOOut(
        losses=losses,
        loss=losses.mean(),
        reward_margin=z.detach().mean(),
        accuracy=(chosen_rewards > rejected_rewards).to(z.dtype).mean(),
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
    )
