"""`--diag`: one diag.jsonl row per optimizer step, its leaves in dataflow order.

Early leaves come from the step's data (the recipe's `StepOutcome.leaves`: sampled indices,
rollouts), then each forward's tokens and logits (kept as the forwards run, moved to the CPU),
the step's loss; the late leaves are read once AdamW has stepped: the summed gradients, the Adam
moments, the parameters, the learning rate and the generator states.

In a data-parallel run each process keeps its own forwards' tokens and logits; they are gathered
in global forward order (the digests are SHA256 over the parts in that order, so rank 0 needs
the bytes themselves: the cost is the step's logits, sent once per process) and rank 0 writes
the row. Every other leaf is already the same on every process.

The row is computed by the recorder's helper process while the next step runs (started when the
hook is made; the leaves' bytes are copied into shared memory at the hand-over — the four LoRA
leaves first into one flat buffer, with one call, checksummed in one pass; where no helper can
run, the recorder's background thread computes the row from these copies); the loop's
checkpoints flush it first, and closing the hook at the end of the run writes the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from twinrun.diag.flat import FlatLeaf, FlatLeaves
from twinrun.train.distributed import in_global_order
from twinrun.train.loop import Forward, Hook, Phase, StepView, rng_state_leaf

if TYPE_CHECKING:
    from twinrun.diag.recorder import DiagRecorder

Parts = tuple[list[torch.Tensor], list[torch.Tensor]]


class DiagHook(Hook):
    points = {"after_forward": Phase.RECORD, "after_update": Phase.RECORD}

    def __init__(self, recorder: DiagRecorder | None) -> None:
        self.recorder = recorder  # None on a process that does not write
        if recorder is not None:
            recorder.start_background()  # the helper process starts while the run sets up
        self.attempt = 0
        self.forwards: list[Parts] = []  # this process's forwards: (tokens, logits)

    def after_forward(self, view: StepView, fw: Forward) -> None:
        if view.attempt != self.attempt:  # a new step, or a spike rerun of this one
            self.attempt, self.forwards = view.attempt, []
        tokens = [t.cpu() for t in fw.tokens]
        logits = [t.detach().float().cpu() for t in fw.logits]
        self.forwards.append((tokens, logits))

    def after_update(self, view: StepView) -> None:
        outcome = view.outcome
        if view.attempt != self.attempt:  # a step whose forwards this process had none of
            self.forwards = []
        forwards = in_global_order(self.forwards, "gathering the diag tokens and logits")
        self.attempt, self.forwards = 0, []
        if self.recorder is None:
            return
        leaves = {
            **outcome.leaves,
            "batch.tokens": [t for tokens, _ in forwards for t in tokens],
            "forward.logits": [t for _, logits in forwards for t in logits],
            "loss": torch.tensor([outcome.loss], dtype=torch.float64),
            **late_leaves(view, copy=not self.recorder.copies_at_hand_over()),
        }
        self.recorder.record_later(view.step, leaves)

    def flush(self) -> None:
        if self.recorder is not None:
            self.recorder.flush()

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


LORA_LEAVES = ("grads.lora", "adam.exp_avg", "adam.exp_avg_sq", "params.lora")


def late_leaves(view: StepView, copy: bool = True) -> dict[str, Any]:
    """The leaves after the backward: gradients, Adam moments, parameters, lr, RNG state — copies,
    since the next step updates them in place while the row is computed (with `copy=False`, for
    a recorder that copies them at the hand-over, the live tensors: the LoRA leaves still in one
    group, which the recorder copies into its shared memory with one call)."""
    states = [view.optimizer.state.get(p, {}) for _, p in view.params]
    parts: list[list[torch.Tensor]] = [
        list(view.grads),
        [s["exp_avg"] for s in states if "exp_avg" in s],
        [s["exp_avg_sq"] for s in states if "exp_avg_sq" in s],
        [p for _, p in view.params],
    ]
    return {
        **dict(zip(LORA_LEAVES, copied(parts, copy), strict=True)),
        "lr": torch.tensor([view.lr], dtype=torch.float64),
        "rng.state": rng_state_leaf(),
    }


def copied(
    leaves: list[list[torch.Tensor]], copy: bool = True
) -> list[FlatLeaf | list[torch.Tensor]]:
    """A copy of each leaf's parts: the leaves whose parts are float32 CPU tensors (the usual
    LoRA leaves) share one flat buffer — one copy for all of them, and one checksum pass (see
    diag/flat.py); any other leaf part by part. With `copy=False` nothing is copied (the group
    is made, to be copied by the recorder at the hand-over)."""
    flat = [i for i, parts in enumerate(leaves) if FlatLeaves.fits(parts)]
    group = FlatLeaves([leaves[i] for i in flat], copy) if flat else None
    out: list[FlatLeaf | list[torch.Tensor]] = []
    for i, parts in enumerate(leaves):
        if group is not None and i in flat:
            out.append(group.leaf(flat.index(i)))
        else:
            out.append([t.detach().clone() for t in parts] if copy else list(parts))
    return out
