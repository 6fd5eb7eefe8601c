"""The optimizer-step loop shared by every objective.

An objective supplies `step_fn(plan) -> StepOutcome`: it runs the forwards and backwards of one
optimizer step and reports its loss and its early diag leaves (sampled indices, tokens, logits,
loss). The loop owns everything around that: the learning rate, zeroing and stepping AdamW, the
gradient norm, metrics rows, the later diag leaves (gradients, Adam moments, parameters, lr, RNG
state) and progress.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from twinrun.core.progress import Progress
from twinrun.train.adamw import AdamW
from twinrun.train.schedule import lr_at


@dataclass
class StepOutcome:
    """What one step's forwards/backwards produced."""

    loss: float
    tokens: int
    rows: int
    leaves: dict[str, Any] = field(default_factory=dict)  # early diag leaves, dataflow order
    metrics: dict[str, Any] = field(default_factory=dict)  # objective-specific metrics
    batch: Any = None  # the OptimizerBatch (train/batch.py), for capture
    on_commit: Callable[[], None] | None = None  # runs once the step's update is applied


@dataclass
class Loop:
    params: list[tuple[str, torch.nn.Parameter]]
    optimizer: AdamW
    base_lr: float
    warmup_steps: int
    total_steps: int
    recorder: Any = None  # a DiagRecorder when --diag
    progress: Progress | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    trace_step: int | None = None  # --trace-step K: per-module checksums at step K
    trace_model: Any = None
    trace_path: Any = None
    spike_factor: float | None = None  # --spike-factor F --spike-window W
    spike_window: int | None = None
    faults: Any = None  # suspended while a spike is rerun
    spikes: list[dict[str, Any]] = field(default_factory=list)
    # called at the optimizer boundary: gradients computed, optimizer not yet stepped
    before_update: Callable[[int, StepOutcome], None] | None = None

    def run_step(self, step: int, step_fn: Callable[[], StepOutcome]) -> dict[str, Any]:
        t0 = time.perf_counter()
        lr = lr_at(step, self.base_lr, self.warmup_steps, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=False)
        rng_before = torch.get_rng_state()
        if self.trace_step == step:
            from twinrun.diag.trace import StepTrace

            with StepTrace(self.trace_model, self.trace_path, step):
                outcome = step_fn()
        else:
            outcome = step_fn()
        spike = self.spike_median(outcome.loss)
        if spike is not None:
            outcome = self.rerun_spike(step, step_fn, outcome, rng_before, spike)
        if self.before_update is not None:
            self.before_update(step, outcome)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for _, p in self.params]
        grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        self.optimizer.step()
        if outcome.on_commit is not None:
            outcome.on_commit()
        row = {
            "step": step,
            "loss": outcome.loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": outcome.tokens,
            "rows": outcome.rows,
            **outcome.metrics,
        }
        if self.recorder is not None:
            self.recorder.record(step, {**outcome.leaves, **self.late_leaves(grads, lr)})
        row["wall_s"] = time.perf_counter() - t0  # the diag row's cost included
        self.metrics.append(row)
        if self.progress is not None:
            self.progress.update(step + 1, f"loss {outcome.loss:.4f} lr {lr:.2e}")
        return row

    def spike_median(self, loss: float) -> float | None:
        """The median of the last W losses when `loss` exceeds F times it (else None)."""
        if self.spike_factor is None or self.spike_window is None:
            return None
        window = [m["loss"] for m in self.metrics[-self.spike_window :]]
        if len(window) < self.spike_window:
            return None
        median = statistics.median(window)
        return median if loss > self.spike_factor * median else None

    def rerun_spike(
        self,
        step: int,
        step_fn: Callable[[], StepOutcome],
        first: StepOutcome,
        rng_before: torch.Tensor,
        median: float,
    ) -> StepOutcome:
        """Rerun a spiking step from its pre-step state (gradients zeroed, generator restored,
        planted faults off). `intrinsic`: the rerun reproduces the loss, gradients and generator
        state bit for bit — the data did it. `transient`: it does not — nondeterminism did.
        Training continues with the rerun's gradients."""

        def fingerprint(outcome: StepOutcome) -> tuple[Any, ...]:
            grads = [
                p.grad.detach().clone() if p.grad is not None else None for _, p in self.params
            ]
            return outcome.loss, grads, torch.get_rng_state()

        loss_a, grads_a, rng_a = fingerprint(first)
        self.optimizer.zero_grad(set_to_none=False)
        torch.set_rng_state(rng_before)
        if self.faults is not None:
            self.faults.suspended = True
        try:
            second = step_fn()
        finally:
            if self.faults is not None:
                self.faults.suspended = False
        loss_b, grads_b, rng_b = fingerprint(second)
        same = (
            loss_a == loss_b
            and torch.equal(rng_a, rng_b)
            and all(
                (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                for a, b in zip(grads_a, grads_b, strict=True)
            )
        )
        record = {
            "step": step, "kind": "intrinsic" if same else "transient", "loss": loss_a,
            "rerun_loss": loss_b, "median": median, "factor": self.spike_factor,
        }  # fmt: skip
        self.spikes.append(record)
        second.metrics["spike"] = record["kind"]
        if self.progress is not None:
            self.progress.note(
                f"step {step}: loss {loss_a:.4f} > {self.spike_factor} x median {median:.4f}; "
                f"rerun -> {loss_b:.4f}: {record['kind']}"
            )
        return second

    def late_leaves(self, grads: list[torch.Tensor], lr: float) -> dict[str, Any]:
        """The leaves after the backward: gradients, Adam moments, parameters, lr, RNG state."""
        states = [self.optimizer.state.get(p, {}) for _, p in self.params]
        return {
            "grads.lora": [g.detach() for g in grads],
            "adam.exp_avg": [s["exp_avg"] for s in states if "exp_avg" in s],
            "adam.exp_avg_sq": [s["exp_avg_sq"] for s in states if "exp_avg_sq" in s],
            "params.lora": [p.detach() for _, p in self.params],
            "lr": torch.tensor([lr], dtype=torch.float64),
            "rng.state": rng_state_leaf(),
        }


def rng_state_leaf() -> list[torch.Tensor]:
    """The torch generator states (CPU, and CUDA when initialised) as uint8 tensors."""
    parts = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += list(torch.cuda.get_rng_state_all())
    return parts


def make_optimizer(
    params: list[tuple[str, torch.nn.Parameter]],
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> AdamW:
    """AdamW with torch's single-tensor operations, in one fixed order (train/adamw.py)."""
    return AdamW([p for _, p in params], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
