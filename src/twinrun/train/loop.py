"""The optimizer-step loop shared by every objective: it owns the step, everything else is a hook.

A recipe (train/recipes/) supplies data and forwards, never behaviour around the step:
- `prepare(step)` -> the step's batch (pure data; may run ahead on the prefetch thread);
- `forwards(step, batch)` -> a generator that yields one `Forward` per forward (its loss, and the
  tensors diagnostics may want) and returns the step's `StepOutcome` (loss, counts, data leaves,
  metrics, the `OptimizerBatch`).

The loop takes each step's batch exactly once, runs every forward's backward itself, keeps each
forward's LoRA gradient apart and sums them in forward order (the bits autograd's `.grad +=` gives
in that order from zero), steps AdamW and writes the metrics row. Hooks (train/hooks/) attach at
named points, in the order they were registered:

    before_step     nothing computed yet (generator states, planted stray draws, a trace opens)
    backward        a hook may run a forward's backward itself (the planted reduction fault)
    after_forward   a forward's gradient is computed (diag keeps its tokens and logits)
    gather          the per-forward gradients, before they are summed (the place where a
                    distributed run all-gathers every process's forwards into global order)
    at_boundary     gradients summed, optimizer not stepped (trace closes, spike rerun,
                    non-finite stop, capture)
    after_update    AdamW stepped (diag writes its row)
    after_step      the metrics row is complete (capture's final pins, checkpoints, timings)

A hook that works in the background (diag computes its rows on a thread) finishes in `flush`,
which every checkpoint calls first, and in `close`, at the end of the run.

Nothing is replaced at run time: a hook is an object in `Loop.hooks`, called where it runs.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from twinrun.config.schedule import lr_at
from twinrun.core.progress import Progress
from twinrun.data.prefetch import Prefetcher
from twinrun.train.adamw import AdamW

Params = list[tuple[str, torch.nn.Parameter]]
Grads = list[torch.Tensor | None]


@dataclass
class Forward:
    """One forward of a step: `loss` is what its backward differentiates (already divided by the
    step's denominator); `row_losses` the same loss per row (their sum is `loss` up to rounding);
    `tokens` / `logits` the tensors of its model calls, for diagnostics (not detached)."""

    loss: torch.Tensor
    row_losses: torch.Tensor | None = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)


@dataclass
class StepOutcome:
    """What one step's forwards produced."""

    loss: float
    tokens: int
    rows: int
    leaves: dict[str, Any] = field(default_factory=dict)  # data leaves before the forwards
    metrics: dict[str, Any] = field(default_factory=dict)  # objective-specific metrics
    batch: Any = None  # the OptimizerBatch (capture/batch.py), for capture and replay
    on_commit: Any = None  # a callable run once the step's update is applied


StepForwards = Generator[Forward, None, StepOutcome]


class Recipe(Protocol):
    def prepare(self, step: int) -> Any: ...

    def forwards(self, step: int, batch: Any) -> StepForwards: ...


@dataclass
class StepContext:
    """One step as the hooks see it."""

    loop: Loop
    step: int
    lr: float
    rng_before: torch.Tensor  # the torch CPU generator before anything of the step ran
    batch: Any = None
    outcome: StepOutcome | None = None
    grads: list[torch.Tensor] = field(default_factory=list)  # summed, one per parameter
    attempt: int = 0  # 1 for the step's forwards, 2 for a spike rerun of them
    rerunning: bool = False  # planted faults stay off in a rerun
    timings: dict[str, float] = field(
        default_factory=lambda: {"forward_s": 0.0, "backward_s": 0.0, "optimizer_s": 0.0}
    )


class Hook:
    """A step hook: override the points it attaches to (each default does nothing)."""

    def before_step(self, ctx: StepContext) -> None:
        pass

    def backward(self, ctx: StepContext, fw: Forward) -> bool:
        """Run `fw`'s backward here and return True, or return False to leave it to the loop."""
        return False

    def after_forward(self, ctx: StepContext, fw: Forward) -> None:
        pass

    def gather(self, ctx: StepContext, per_forward: list[Grads]) -> list[Grads]:
        return per_forward

    def at_boundary(self, ctx: StepContext) -> None:
        pass

    def after_update(self, ctx: StepContext) -> None:
        pass

    def after_step(self, ctx: StepContext, row: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        """Finish what the hook does in the background (a checkpoint is about to be written)."""

    def close(self) -> None:
        """The run ended (finished or raised): release what the hook holds open."""


@dataclass
class Loop:
    params: Params
    optimizer: AdamW
    base_lr: float
    warmup_steps: int
    total_steps: int
    hooks: list[Hook] = field(default_factory=list)
    schedule: str = "cosine"
    decay_steps: int | None = None
    stop_after: int | None = None  # run only the first N steps (the schedule is still T steps)
    progress: Progress | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def run(self, recipe: Recipe, start: int, prefetch: int = 0) -> None:
        """Steps `start` .. total_steps - 1 (or up to `stop_after`); each batch is taken from the
        prefetcher once."""
        stop = (
            self.total_steps if self.stop_after is None else min(self.stop_after, self.total_steps)
        )
        ahead = Prefetcher(recipe.prepare, range(start, stop), prefetch)
        try:
            for step in range(start, stop):
                self.run_step(step, recipe, ahead.get(step))
        finally:
            ahead.close()

    def run_step(self, step: int, recipe: Recipe, batch: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        lr = lr_at(
            step, self.base_lr, self.warmup_steps, self.total_steps, self.schedule,
            self.decay_steps,
        )  # fmt: skip
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        ctx = StepContext(self, step, lr, torch.get_rng_state(), batch)
        for hook in self.hooks:
            hook.before_step(ctx)
        self.compute(ctx, recipe)
        for hook in self.hooks:
            hook.at_boundary(ctx)
        outcome = ctx.outcome
        assert outcome is not None
        grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in ctx.grads])))
        t1 = time.perf_counter()
        self.optimizer.step()
        ctx.timings["optimizer_s"] = time.perf_counter() - t1
        if outcome.on_commit is not None:
            outcome.on_commit()
        for hook in self.hooks:
            hook.after_update(ctx)
        row = {
            "step": step,
            "loss": outcome.loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": outcome.tokens,
            "rows": outcome.rows,
            **outcome.metrics,
            "wall_s": time.perf_counter() - t0,  # the diag row's cost included
        }
        self.metrics.append(row)
        for hook in self.hooks:
            hook.after_step(ctx, row)
        if self.progress is not None:
            self.progress.update(step + 1, f"loss {outcome.loss:.4f} lr {lr:.2e}")
        return row

    def compute(self, ctx: StepContext, recipe: Recipe) -> None:
        """The step's forwards and backwards: each forward's gradient apart, then summed in
        forward order into `.grad` (also what a spike rerun calls again, on the same batch)."""
        ctx.attempt += 1
        for _, p in self.params:
            p.grad = None
        per_forward: list[Grads] = []
        steps = recipe.forwards(ctx.step, ctx.batch)
        while True:
            t0 = time.perf_counter()
            try:
                fw = next(steps)
            except StopIteration as done:
                ctx.outcome = done.value
                break
            finally:
                ctx.timings["forward_s"] += time.perf_counter() - t0
            t1 = time.perf_counter()
            per_forward.append(self.backward(ctx, fw))
            ctx.timings["backward_s"] += time.perf_counter() - t1
            for hook in self.hooks:
                hook.after_forward(ctx, fw)
        for hook in self.hooks:
            per_forward = hook.gather(ctx, per_forward)
        ctx.grads = sum_in_forward_order(self.params, per_forward)
        for (_, p), g in zip(self.params, ctx.grads, strict=True):
            p.grad = g

    def backward(self, ctx: StepContext, fw: Forward) -> Grads:
        """One forward's gradient per parameter (None where it does not reach a parameter)."""
        if not any(hook.backward(ctx, fw) for hook in self.hooks):
            fw.loss.backward()
        grads = [p.grad for _, p in self.params]
        for _, p in self.params:
            p.grad = None
        return grads


def sum_in_forward_order(params: Params, per_forward: list[Grads]) -> list[torch.Tensor]:
    """zeros, + forward 0, + forward 1, ...: the bits `.grad +=` gives in that order."""
    total = [torch.zeros_like(p) for _, p in params]
    for grads in per_forward:
        for acc, g in zip(total, grads, strict=True):
            if g is not None:
                acc += g
    return total


def rng_state_leaf() -> list[torch.Tensor]:
    """The torch generator states (CPU, and CUDA when initialised) as uint8 tensors."""
    parts = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += list(torch.cuda.get_rng_state_all())
    return parts


def make_optimizer(
    params: Params,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> AdamW:
    """AdamW with torch's single-tensor operations, in one fixed order (train/adamw.py)."""
    return AdamW([p for _, p in params], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
