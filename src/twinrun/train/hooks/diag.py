"""`--diag`: one diag.jsonl row per optimizer step, its leaves in dataflow order.

Early leaves come from the step's data (the recipe's `StepOutcome.leaves`: sampled indices,
rollouts), then each forward's tokens and logits (kept as the forwards run, moved to the CPU),
the step's loss; the late leaves are read once AdamW has stepped: the summed gradients, the Adam
moments, the parameters, the learning rate and the generator states.

In a data-parallel run each process keeps its own forwards' tokens and logits; they are gathered
in global forward order (the digests are hashes over the parts in that order, so rank 0 needs
the bytes themselves: the cost is the step's logits, sent once per process) and rank 0 writes
the row. Every other leaf is already the same on every process.

The row is computed and written by the recorder as the step ends, on the loop's thread (the four
LoRA leaves copied into one flat buffer with one call and checksummed in one pass), before the
next step changes any of the tensors: nothing is snapshot for later, and nothing is left to write
when a checkpoint flushes or the hook is closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from twinrun.diag.flat import FlatLeaf, FlatLeaves
from twinrun.train.parallel.distributed import in_global_order
from twinrun.train.step.loop import Forward, Hook, Phase, StepView, rng_state_leaf

if TYPE_CHECKING:
    from twinrun.diag.recorder import DiagRecorder

Parts = tuple[list[torch.Tensor], list[torch.Tensor]]


class DiagHook(Hook):
    points = {"after_forward": Phase.RECORD, "after_update": Phase.RECORD}

    def __init__(self, recorder: DiagRecorder | None) -> None:
        self.recorder = recorder  # None on a process that does not write
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
            "loss": [float(outcome.loss)],  # as a 1-element float64 tensor: the same digest
            **late_leaves(view),  # the live tensors: the row is written before they change
        }
        self.recorder.record_later(view.step, leaves)

    def flush(self) -> None:
        if self.recorder is not None:
            self.recorder.flush()

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.close()


LORA_LEAVES = ("grads.lora", "adam.exp_avg", "adam.exp_avg_sq", "params.lora")


def late_leaves(view: StepView, copy: bool = False) -> dict[str, Any]:
    """The leaves after the backward: gradients, Adam moments, parameters, lr, RNG state, the
    LoRA leaves in one group (see `copied`). The tensors themselves, for a row computed at once;
    with `copy=True`, copies (for a caller that computes the row while the next step runs and
    updates them in place)."""
    states = [view.optimizer.state.get(p, {}) for _, p in view.params]
    parts: list[list[torch.Tensor]] = [
        list(view.grads),
        [s["exp_avg"] for s in states if "exp_avg" in s],
        [s["exp_avg_sq"] for s in states if "exp_avg_sq" in s],
        [p for _, p in view.params],
    ]
    return {
        **dict(zip(LORA_LEAVES, copied(parts, copy), strict=True)),
        "lr": [float(view.lr)],
        "rng.state": rng_state_leaf(),
    }


def copied(
    leaves: list[list[torch.Tensor]], copy: bool = True
) -> list[FlatLeaf | list[torch.Tensor]]:
    """A copy of each leaf's parts: the leaves whose parts are float32 CPU tensors (the usual
    LoRA leaves) share one flat buffer — one copy for all of them, and one checksum pass (see
    diag/flat.py); any other leaf part by part. With `copy=False` nothing is copied now: the
    group reads the leaves' own buffers when their parts tile them (`FlatLeaves.over_tiles`),
    else copies its parts into its flat buffer when the row is computed."""
    tiles = None if copy else FlatLeaves.over_tiles(leaves)
    if tiles is not None:
        return [tiles.leaf(i) for i in range(len(leaves))]
    flat = [i for i, parts in enumerate(leaves) if FlatLeaves.fits(parts)]
    group = FlatLeaves([leaves[i] for i in flat], copy) if flat else None
    out: list[FlatLeaf | list[torch.Tensor]] = []
    for i, parts in enumerate(leaves):
        if group is not None and i in flat:
            out.append(group.leaf(flat.index(i)))
        else:
            out.append([t.detach().clone() for t in parts] if copy else list(parts))
    return out
