"""`--diag`: one diag.jsonl row per optimizer step, its leaves in dataflow order.

Early leaves come from the step's data (the recipe's `StepOutcome.leaves`: sampled indices,
rollouts), then each forward's tokens and logits (kept as the forwards run, moved to the CPU),
the step's loss; the late leaves are read once AdamW has stepped: the summed gradients, the Adam
moments, the parameters, the learning rate and the generator states.

The row is computed on the recorder's background thread while the next step runs (the tensors
the next step updates in place — parameters and Adam moments — are handed over as copies); the
loop's checkpoints flush it first, and closing the hook at the end of the run writes the rest.
"""

from __future__ import annotations

from typing import Any

import torch

from twinrun.train.loop import Forward, Hook, StepContext, rng_state_leaf


class DiagHook(Hook):
    def __init__(self, recorder: Any) -> None:
        self.recorder = recorder  # a DiagRecorder
        self.attempt = 0
        self.tokens: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []

    def after_forward(self, ctx: StepContext, fw: Forward) -> None:
        if ctx.attempt != self.attempt:  # a new step, or a spike rerun of this one
            self.attempt, self.tokens, self.logits = ctx.attempt, [], []
        self.tokens += [t.cpu() for t in fw.tokens]
        self.logits += [t.detach().float().cpu() for t in fw.logits]

    def after_update(self, ctx: StepContext) -> None:
        outcome = ctx.outcome
        assert outcome is not None
        leaves = {
            **outcome.leaves,
            "batch.tokens": self.tokens,
            "forward.logits": self.logits,
            "loss": torch.tensor([outcome.loss], dtype=torch.float64),
            **late_leaves(ctx),
        }
        self.recorder.record_later(ctx.step, leaves)
        self.attempt, self.tokens, self.logits = 0, [], []

    def flush(self) -> None:
        self.recorder.flush()

    def close(self) -> None:
        self.recorder.close()


def late_leaves(ctx: StepContext) -> dict[str, Any]:
    """The leaves after the backward: gradients, Adam moments, parameters, lr, RNG state — copies,
    since the next step updates them in place while the row is computed."""
    loop = ctx.loop
    states = [loop.optimizer.state.get(p, {}) for _, p in loop.params]
    return {
        "grads.lora": [g.detach().clone() for g in ctx.grads],
        "adam.exp_avg": [s["exp_avg"].clone() for s in states if "exp_avg" in s],
        "adam.exp_avg_sq": [s["exp_avg_sq"].clone() for s in states if "exp_avg_sq" in s],
        "params.lora": [p.detach().clone() for _, p in loop.params],
        "lr": torch.tensor([ctx.lr], dtype=torch.float64),
        "rng.state": rng_state_leaf(),
    }
