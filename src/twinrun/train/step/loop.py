"""The optimizer-step loop shared by every objective: it owns the step and its policies; hooks
observe it.

A recipe (train/recipes/) supplies data and forwards, never behaviour around the step:
- `prepare(step)` -> the step's plan (pure data; may run ahead on the prefetch thread);
- `collect(step, plan)` -> the step's batch: everything the update reads that is made from the
  current policy or the world outside — GRPO samples, runs the environment (tool turns
  included), scores the rewards, computes the advantages and draws the replayed rollouts; for
  the other objectives the plan is the batch (`StepRecipe`'s default), as it is for a replayed
  step, whose batch was collected by the run that captured it;
- `forwards(step, batch)` -> a generator that yields one `Forward` per forward (its loss, and the
  tensors diagnostics may want) and returns the step's `StepOutcome` (loss, counts, data leaves,
  metrics, the `OptimizerBatch`); it reads only the batch, so it can run again on it;
- `after_update(step, outcome)` -> what the recipe keeps once the update is applied (GRPO's
  replay buffer takes the step's rollouts); `StepRecipe` gives the default, nothing.

The loop takes each step's plan exactly once, collects its batch exactly once (after the
`before_step` hooks: a trace of the step covers its sampling), and runs every forward's
backward itself; a rerun of the step (a spike) runs the forwards again on the collected batch,
never `collect`. `collect` draws from no framework generator (GRPO's draws are keyed streams),
so the rerun, from the step's generator state, sees what the first computation saw. What the
step computes is decided by the loop's own fields, chosen when the run is built
(train/driver.py `build_loop`, for training and replay alike) and named where they act:

    backward    one forward's backward: `PlainBackward`, or the planted reduction fault
                (train/step/policies.py `ReductionFault`)
    parts       one forward's gradient as the parts the sum adds in order: `WholeForward`
                (its `.grad`), or, in batch-invariant mode, each row's gradient apart
                (train/step/policies.py `RowParts`: any split of a step's rows into forwards, and
                of forwards into processes, then adds the same rows in the same order)
    combine     the per-forward gradients into the step's: `LocalSum` (zeros, + forward 0,
                + forward 1, ...: the bits autograd's `.grad +=` gives in that order), or the
                distributed ordered gather that sums every process's forwards in global order
                (train/parallel/gather.py `OrderedGather`)
    spike       `SpikeRerun` or None: a step whose loss spikes is computed again on the same
                batch from the same generator state (train/step/policies.py)
    stray_draw  `StrayDraw` or None: the planted `rng` fault's draw before its step

Then AdamW steps and the metrics row is written. Hooks (train/hooks/) observe the step at named
points, through a read-only `StepView`:

    before_step     nothing computed yet (generator states are taken, a trace opens)
    after_forward   a forward's gradient is computed (diag keeps its tokens and logits)
    computed        the step's gradients combined, before a spike rerun (the trace closes)
    at_boundary     the gradients final, optimizer not stepped (non-finite stop, capture)
    after_update    AdamW stepped and the recipe's `after_update` run (diag writes its row)
    after_step      the metrics row is complete (capture's final pins, eval, checkpoints, timings)

A hook declares the points it attaches to and its phase at each (`Hook.points`); at a point the
loop calls its hooks by phase — `CHECK` (may stop the run), `RECORD` (adds its fields to the
step's metrics), `PERSIST` (writes the step out, every field added) — and hooks sharing a phase
do not depend on one another. A hook's only writes into the step are the metrics fields it adds
(`StepView.metrics` up to the boundary, the row after the step).

A hook that works in the background (diag computes its rows on a thread) finishes in `flush`,
which every checkpoint calls first, and in `close`, at the end of the run.

Nothing is replaced at run time: a hook is an object in `Loop.hooks`, called where it runs.
"""

from __future__ import annotations

import enum
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

import torch

from twinrun.config.schedule import lr_at
from twinrun.core.progress import Progress
from twinrun.core.tiles import tiled_zeros
from twinrun.data.prefetch import Prefetcher
from twinrun.train.step.adamw import AdamW

if TYPE_CHECKING:
    from twinrun.capture.batch import OptimizerBatch

Params = list[tuple[str, torch.nn.Parameter]]
Grads = list[torch.Tensor | None]
Parts = list[Grads]  # one forward's gradient, as the parts that are added in order
P = TypeVar("P")  # a recipe's step plan (what `prepare` gives)
B = TypeVar("B")  # a recipe's collected batch (what `forwards` reads)


@dataclass
class Forward:
    """One forward of a step: `loss` is what its backward differentiates (already divided by the
    step's denominator); `row_losses` the same loss per row (their sum is `loss` up to rounding);
    `tokens` / `logits` the tensors of its model calls, for diagnostics (not detached).
    `padding`: a forward a sharded base runs only to stay in lockstep with the other processes
    (train/parallel/sharding.py); the loop runs its backward and drops its gradient."""

    loss: torch.Tensor
    row_losses: torch.Tensor | None = None
    tokens: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    padding: bool = False


@dataclass
class StepOutcome:
    """What one step's forwards produced."""

    loss: float
    tokens: int
    rows: int
    leaves: dict[str, Any] = field(default_factory=dict)  # data leaves before the forwards
    metrics: dict[str, Any] = field(default_factory=dict)  # objective-specific metrics
    batch: OptimizerBatch | None = None  # what the step trained on, for capture and replay


StepForwards = Generator[Forward, None, StepOutcome]


class StepRecipe(ABC, Generic[P, B]):
    """What the loop asks of a recipe each step (the module docstring says what each does);
    `collect` gives the plan as the batch and `after_update` keeps nothing unless a recipe says
    otherwise."""

    @abstractmethod
    def prepare(self, step: int) -> P:
        """The step's plan (pure data)."""

    def collect(self, step: int, plan: P) -> B:
        """The step's batch, made once from its plan (the plan itself unless a recipe samples)."""
        return plan  # type: ignore[return-value]  # P is B for a recipe that collects nothing

    @abstractmethod
    def forwards(self, step: int, batch: B) -> StepForwards:
        """Yield one `Forward` per forward over the collected batch; return the step's
        `StepOutcome`."""

    def after_update(self, step: int, outcome: StepOutcome) -> None:
        """The step's update is applied: keep what later steps use (GRPO's replay buffer)."""


# the loop's policies: the defaults here, the others in train/step/policies.py and
# train/parallel/gather.py


class BackwardPolicy(Protocol):
    def run(self, step: int, fw: Forward, rerun: bool) -> None:
        """Accumulate `fw`'s gradient into the parameters' `.grad` (from None)."""


class PlainBackward:
    def run(self, step: int, fw: Forward, rerun: bool) -> None:
        fw.loss.backward()


class GradientParts(Protocol):
    def run(self, backward: Callable[[], None], params: Params) -> Parts:
        """Run one forward's `backward` and return its gradient as parts to add in order."""
        ...


class WholeForward:
    """A forward's gradient is one part: what its backward accumulated into `.grad`."""

    def run(self, backward: Callable[[], None], params: Params) -> Parts:
        backward()
        return [[p.grad for _, p in params]]


class GradientCombiner(Protocol):
    def combine(self, params: Params, per_forward: list[Parts]) -> list[torch.Tensor]:
        """The step's gradient per parameter, from each forward's parts."""
        ...


class LocalSum:
    """This process's forwards, summed in forward order."""

    def combine(self, params: Params, per_forward: list[Parts]) -> list[torch.Tensor]:
        return sum_in_forward_order(params, per_forward)


class SpikePolicy(Protocol):
    spikes: list[dict[str, Any]]  # the reruns of the run so far, one record each

    def exceeded(self, history: Sequence[dict[str, Any]], loss: float) -> float | None:
        """The baseline `loss` spikes above (the step is rerun), or None."""
        ...

    def judge(self, step: int, median: float, first: Attempt, rerun: Attempt) -> str:
        """What the rerun says of the spike (its `spike` metric)."""
        ...


class PlantedDraw(Protocol):
    def before_step(self, step: int) -> None:
        """Draw from a generator before the step, where a fault is planted."""


@dataclass
class StepState:
    """One step as the loop computes it (hooks see it through a `StepView`)."""

    step: int
    lr: float
    rng_before: torch.Tensor  # the torch CPU generator before anything of the step ran
    outcome: StepOutcome | None = None
    grads: list[torch.Tensor] = field(default_factory=list)  # combined, one per parameter
    attempt: int = 0  # 1 for the step's forwards, 2 for a spike rerun of them
    timings: dict[str, float] = field(
        default_factory=lambda: {
            "collect_s": 0.0, "forward_s": 0.0, "backward_s": 0.0, "optimizer_s": 0.0,
        }
    )  # fmt: skip


class StepView:
    """What a hook reads of the step and of the loop's state. The parameters and the optimizer
    are the loop's own objects: hooks read them (diag copies, capture and checkpoints write
    bytes of them) and never change them."""

    __slots__ = ("_loop", "_state")

    def __init__(self, loop: Loop, state: StepState) -> None:
        self._loop, self._state = loop, state

    @property
    def step(self) -> int:
        return self._state.step

    @property
    def lr(self) -> float:
        return self._state.lr

    @property
    def rng_before(self) -> torch.Tensor:
        return self._state.rng_before

    @property
    def outcome(self) -> StepOutcome:
        """What the forwards returned (from `computed` on; a spike rerun replaces it)."""
        assert self._state.outcome is not None, "the step has not computed yet"
        return self._state.outcome

    @property
    def metrics(self) -> dict[str, Any]:
        """The step's objective metrics, where boundary hooks add their fields."""
        return self.outcome.metrics

    @property
    def grads(self) -> Sequence[torch.Tensor]:
        return tuple(self._state.grads)

    @property
    def attempt(self) -> int:
        return self._state.attempt

    @property
    def timings(self) -> Mapping[str, float]:
        return MappingProxyType(self._state.timings)

    @property
    def params(self) -> Sequence[tuple[str, torch.nn.Parameter]]:
        return tuple(self._loop.params)

    @property
    def optimizer(self) -> AdamW:
        return self._loop.optimizer

    @property
    def total_steps(self) -> int:
        return self._loop.total_steps

    @property
    def history(self) -> Sequence[dict[str, Any]]:
        """The metrics rows written so far: the steps before this one, and from `after_step` on
        this step's row last."""
        return tuple(self._loop.metrics)


class Phase(enum.IntEnum):
    """When a hook runs at a point, relative to the other hooks there."""

    CHECK = 10  # may stop the run before anything of the step is recorded
    RECORD = 20  # reads the step and adds its fields to the step's metrics
    PERSIST = 30  # writes the step out, once every field has been added


POINTS = ("before_step", "after_forward", "computed", "at_boundary", "after_update", "after_step")


class Hook:
    """A step hook: `points` names the points it attaches to, with its phase at each; it
    overrides exactly those (each default does nothing)."""

    points: ClassVar[Mapping[str, Phase]] = {}

    def before_step(self, view: StepView) -> None:
        pass

    def after_forward(self, view: StepView, fw: Forward) -> None:
        pass

    def computed(self, view: StepView) -> None:
        pass

    def at_boundary(self, view: StepView) -> None:
        pass

    def after_update(self, view: StepView) -> None:
        pass

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        pass

    def flush(self) -> None:
        """Finish what the hook does in the background (a checkpoint is about to be written)."""

    def close(self) -> None:
        """The run ended (finished or raised): release what the hook holds open."""


def by_point(hooks: Sequence[Hook]) -> dict[str, list[Hook]]:
    """Each point's hooks in phase order (registration order only among hooks of one phase,
    which do not depend on one another). A hook must declare every point it overrides."""
    for hook in hooks:
        unknown = set(hook.points) - set(POINTS)
        overridden = {p for p in POINTS if getattr(type(hook), p) is not getattr(Hook, p)}
        if unknown or overridden != set(hook.points):
            raise TypeError(
                f"{type(hook).__name__} declares points {sorted(hook.points)} but overrides "
                f"{sorted(overridden)}"
            )
    return {
        point: sorted((h for h in hooks if point in h.points), key=lambda h: h.points[point])
        for point in POINTS
    }


@dataclass
class Loop:
    params: Params
    optimizer: AdamW
    base_lr: float
    warmup_steps: int
    total_steps: int
    hooks: list[Hook] = field(default_factory=list)
    backward: BackwardPolicy = field(default_factory=PlainBackward)
    parts: GradientParts = field(default_factory=WholeForward)
    combine: GradientCombiner = field(default_factory=LocalSum)
    spike: SpikePolicy | None = None
    stray_draw: PlantedDraw | None = None
    schedule: str = "cosine"
    decay_steps: int | None = None
    stop_after: int | None = None  # run only the first N steps (the schedule is still T steps)
    max_grad_norm: float | None = None  # clip the step's gradient to this L2 norm
    progress: Progress | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    at: dict[str, list[Hook]] = field(init=False)  # each point's `hooks`, in phase order

    def __post_init__(self) -> None:
        self.at = by_point(self.hooks)

    def run(self, recipe: StepRecipe[P, B], start: int, prefetch: int = 0) -> None:
        """Steps `start` .. total_steps - 1 (or up to `stop_after`); each plan is taken from the
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

    def run_step(self, step: int, recipe: StepRecipe[P, B], plan: P) -> dict[str, Any]:
        """One step: its batch collected from `plan` (once), then computed, judged, applied and
        recorded."""
        t0 = time.perf_counter()
        lr = self.set_lr(step)
        state = StepState(step, lr, torch.get_rng_state())
        view = StepView(self, state)
        if self.stray_draw is not None:
            self.stray_draw.before_step(step)
        for hook in self.at["before_step"]:
            hook.before_step(view)
        t_collect = time.perf_counter()
        batch = recipe.collect(step, plan)
        state.timings["collect_s"] = time.perf_counter() - t_collect
        self.compute(state, view, recipe, batch)
        for hook in self.at["computed"]:
            hook.computed(view)
        spike = self.spike
        median = None if spike is None else spike.exceeded(self.metrics, view.outcome.loss)
        if median is not None:
            self.rerun(state, view, recipe, batch, median)
        grad_norm = self.boundary(state, view)
        outcome = view.outcome
        t1 = time.perf_counter()
        self.optimizer.step()
        state.timings["optimizer_s"] = time.perf_counter() - t1
        recipe.after_update(step, outcome)
        for hook in self.at["after_update"]:
            hook.after_update(view)
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
        for hook in self.at["after_step"]:
            hook.after_step(view, row)
        if self.progress is not None:
            self.progress.update(step + 1, progress_text(outcome, lr))
        return row

    def boundary(self, state: StepState, view: StepView) -> float:
        """The step's gradient is final: clipped (with `max_grad_norm`, before any hook reads
        it), then the boundary hooks; returns its norm before clipping (as TRL logs it)."""
        if self.max_grad_norm is None:
            for hook in self.at["at_boundary"]:
                hook.at_boundary(view)
            return fixed_order_norm(state.grads)
        norm = fixed_order_norm(state.grads)
        view.metrics["grad_clip"] = clip_to_norm(state.grads, norm, self.max_grad_norm)
        for hook in self.at["at_boundary"]:
            hook.at_boundary(view)
        return norm

    def set_lr(self, step: int) -> float:
        """The schedule's learning rate of `step`, set on the optimizer."""
        lr = lr_at(
            step, self.base_lr, self.warmup_steps, self.total_steps, self.schedule,
            self.decay_steps,
        )  # fmt: skip
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def compute(
        self, state: StepState, view: StepView, recipe: StepRecipe[Any, B], batch: B
    ) -> None:
        """The step's forwards and backwards on its collected batch: each forward's gradient
        apart, then combined into `.grad` (also what a spike rerun calls again, on the same
        batch)."""
        state.attempt += 1
        for _, p in self.params:
            p.grad = None
        per_forward: list[Parts] = []
        steps = recipe.forwards(state.step, batch)
        while True:
            t0 = time.perf_counter()
            try:
                fw = next(steps)
            except StopIteration as done:
                state.outcome = done.value
                break
            finally:
                state.timings["forward_s"] += time.perf_counter() - t0
            t1 = time.perf_counter()
            backward = partial(self.backward.run, state.step, fw, rerun=state.attempt > 1)
            parts = self.parts.run(backward, self.params)
            if not fw.padding:
                per_forward.append(parts)
            for _, p in self.params:
                p.grad = None
            state.timings["backward_s"] += time.perf_counter() - t1
            if fw.padding:
                continue
            for hook in self.at["after_forward"]:
                hook.after_forward(view, fw)
        state.grads = self.combine.combine(self.params, per_forward)
        for (_, p), g in zip(self.params, state.grads, strict=True):
            p.grad = g

    def rerun(
        self,
        state: StepState,
        view: StepView,
        recipe: StepRecipe[Any, B],
        batch: B,
        median: float,
    ) -> None:
        """The spiking step computed again from its pre-step generator state, on the same
        collected batch (nothing is sampled and no environment is called again; planted faults
        off); the spike policy judges the two attempts, training continues with the rerun's
        gradients."""
        assert self.spike is not None
        first = Attempt(view.outcome.loss, state.grads, torch.get_rng_state())
        torch.set_rng_state(state.rng_before)
        self.compute(state, view, recipe, batch)
        second = Attempt(view.outcome.loss, state.grads, torch.get_rng_state())
        view.metrics["spike"] = self.spike.judge(state.step, median, first, second)


def progress_text(outcome: StepOutcome, lr: float) -> str:
    """The progress line's figures of a step: its loss and learning rate, and a sampling run's
    reward mean and spread (a GRPO loss is near 0 whether or not the model learns)."""
    m = outcome.metrics
    reward = ""
    if "reward_mean" in m and "reward_std" in m:
        reward = f"reward {m['reward_mean']:.3f} ± {m['reward_std']:.3f} "
    return f"{reward}loss {outcome.loss:.4f} lr {lr:.2e}"


class Attempt(NamedTuple):
    """One computation of a step: its loss, gradients and the generator state after it."""

    loss: float
    grads: list[torch.Tensor]
    rng_after: torch.Tensor


NORM_ROW = 4096  # below ATen's grain size: one row's sum never splits across threads


def fixed_order_norm(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of all tensors together, in an order no thread count changes: float64
    squares in rows of NORM_ROW (each row reduced whole by one thread), the row sums then added
    one after another as Python floats."""
    total = 0.0
    for g in tensors:
        flat = g.detach().reshape(-1).to(torch.float64)
        rows = torch.nn.functional.pad(flat, (0, (-flat.numel()) % NORM_ROW)).view(-1, NORM_ROW)
        for s in (rows * rows).sum(dim=1).tolist():
            total += s
    return math.sqrt(total)


CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6)


def clip_to_norm(grads: Sequence[torch.Tensor], norm: float, max_norm: float) -> float:
    """Scale `grads` in place so that their L2 norm (`norm`, `fixed_order_norm`'s) is at most
    `max_norm`: each multiplied by `max_norm / (norm + 1e-6)` when that is below 1 (torch's
    rule), else left alone. Returns the factor applied (1.0: not clipped). The factor is one
    Python float, so the bytes depend on no thread count."""
    coef = max_norm / (norm + CLIP_EPS)
    if coef >= 1.0:
        return 1.0
    for g in grads:
        g.mul_(coef)
    return coef


def sum_in_forward_order(params: Params, per_forward: list[Parts]) -> list[torch.Tensor]:
    """zeros, + forward 0, + forward 1, ... (each forward's parts in order): the bits
    `.grad +=` gives in that order."""
    total = tiled_zeros([p for _, p in params])  # one buffer: the same bits as zeros_like
    for parts in per_forward:
        for grads in parts:
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
    """AdamW with torch's single-tensor operations, in one fixed order (train/step/adamw.py)."""
    return AdamW([p for _, p in params], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
