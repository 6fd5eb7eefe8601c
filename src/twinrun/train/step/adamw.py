"""AdamW, written out: the exact operations of torch's single-tensor AdamW (`foreach=False`,
no amsgrad, not capturable), in one fixed order.

Why not `torch.optim.AdamW`: constructing any torch optimizer imports `torch._dynamo`, about
1.5 s of start-up — a third of a toy run's wall time. This class is bitwise identical to
torch's (tests/unit/train/test_adamw.py compares them step by step) and keeps the parts of its
interface twinrun uses: `param_groups`, `state`, `zero_grad`, `step`, `state_dict`,
`load_state_dict`.

Per parameter p with gradient g, at step t (counted from 1):

    p   <- p * (1 - lr * weight_decay)
    m   <- lerp(m, g, 1 - beta1)
    v   <- v * beta2 + (1 - beta2) * g * g
    p   <- p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from twinrun.core.tiles import tiled, tiled_zeros

MOMENTS = ("exp_avg", "exp_avg_sq")  # copied by `_tile_states` (`load_state_dict` clones the rest)


class AdamW:
    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        self.params = list(params)
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        ]
        self.state: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, (beta1, beta2) = group["lr"], group["betas"]
        eps, weight_decay = group["eps"], group["weight_decay"]
        self._create_states()
        for p in self.params:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            state["step"] += 1
            if weight_decay != 0:
                p.mul_(1 - lr * weight_decay)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            bias_correction1 = 1 - beta1**step
            bias_correction2_sqrt = (1 - beta2**step) ** 0.5
            denom = (state["exp_avg_sq"].sqrt() / bias_correction2_sqrt).add_(eps)
            p.addcdiv_(state["exp_avg"], denom, value=-(lr / bias_correction1))

    def _create_states(self) -> None:
        """Zero state for every parameter with a gradient and no state yet: each moment of
        those parameters in one buffer (see `twinrun.core.tiles`; the same values and bytes as
        one `zeros_like` per parameter)."""
        new = [p for p in self.params if p.grad is not None and p not in self.state]
        if not new:
            return
        for p, m, v in zip(new, tiled_zeros(new), tiled_zeros(new), strict=True):
            self.state[p] = {
                "step": torch.tensor(0.0, dtype=torch.float32),
                "exp_avg": m,
                "exp_avg_sq": v,
            }

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: state by parameter index, one param group listing the indices."""
        index = {p: i for i, p in enumerate(self.params)}
        return {
            "state": {index[p]: dict(s) for p, s in self.state.items()},
            "param_groups": [{**self.param_groups[0], "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        group = dict(sd["param_groups"][0])
        group.pop("params", None)
        group["betas"] = tuple(group["betas"])
        self.param_groups = [group]
        self.state = {
            self.params[int(i)]: {k: v if k in MOMENTS else v.clone() for k, v in s.items()}
            for i, s in sd["state"].items()
        }
        self._tile_states()

    def _tile_states(self) -> None:
        """Each moment of every parameter copied into one buffer, as `step` creates them (after
        a state was put in from elsewhere: a checkpoint, a capture); the same values."""
        states = [self.state[p] for p in self.params if p in self.state]
        for key in MOMENTS:
            have = [s for s in states if key in s]
            for s, t in zip(have, tiled([s[key] for s in have]), strict=True):
                s[key] = t
