"""Build a run's step loop with its policies and hooks, and drive it: resume from the newest
checkpoint, run the steps, close what the hooks opened. Shared by every objective.

`build_loop` is the one place a `Loop` is built, for training and replay alike: where a reader
sees how a step is computed (the optimizer, the loop's backward, gradient combination, spike
rerun and planted stray draw). `training_hooks` says which hooks observe a training run; each
hook declares its points and phases itself (train/step/loop.py says what they are).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from twinrun.config.resolved import Evaluation, ValidRun
from twinrun.config.schedule import check_schedule
from twinrun.core import interrupts
from twinrun.core.fileio import atomic_write_text
from twinrun.core.progress import Progress
from twinrun.train.hooks.checkpoint import Checkpointer, CheckpointHook, ObjectiveState
from twinrun.train.hooks.nonfinite import NonFiniteHook
from twinrun.train.hooks.report import ReportHook
from twinrun.train.interrupt import InterruptHook, stop_signals
from twinrun.train.outputs.checkpoint import (
    check_same_run,
    newest_checkpoint,
    restore,
    resume_point,
)
from twinrun.train.outputs.run_dir import COMPLETIONS, DIAG, TRACE
from twinrun.train.parallel import distributed
from twinrun.train.setup.session import Session
from twinrun.train.step.faults import Faults
from twinrun.train.step.loop import (
    B,
    BackwardPolicy,
    GradientCombiner,
    Hook,
    LocalSum,
    Loop,
    P,
    Params,
    PlainBackward,
    StepRecipe,
    WholeForward,
    make_optimizer,
)
from twinrun.train.step.policies import ReductionFault, RowParts, SpikeRerun, StrayDraw

LOGS = (DIAG, TRACE, COMPLETIONS)  # cut back to the checkpoint at a resume

__all__ = [
    "ObjectiveState", "build_loop", "drive", "make_loop", "spikes_of", "training_hooks",
    "truncate_logs",
]  # fmt: skip


def make_loop(s: Session, total_steps: int, objective: ObjectiveState | None = None) -> Loop:
    """The loop of this training run: `build_loop` with the hooks that observe it."""
    stop_after = s.run.switches.stop_after  # the progress counts the steps this run will do
    last = total_steps if stop_after is None else min(stop_after, total_steps)
    progress = Progress(last, f"{s.run.objective} step", quiet=s.run.switches.quiet)
    if s.run.switches.resume and distributed.is_root():
        truncate_logs(s.out, resume_point(s.out))
    hooks = training_hooks(s, total_steps, objective)
    return build_loop(s.run, s.params, total_steps, hooks, s.faults, progress)


def training_hooks(s: Session, total_steps: int, objective: ObjectiveState | None) -> list[Hook]:
    """The hooks of a training run, in the order they are registered (each declares its own
    points and phases)."""
    run, switches = s.run, s.run.switches
    root = distributed.is_root()
    hooks: list[Hook] = []
    checkpointer = Checkpointer(s.out, s.shaping(), objective, flush=hooks)
    if switches.trace_step is not None:
        from twinrun.train.hooks.trace import TraceHook

        hooks.append(TraceHook(s.model, s.out / "trace.jsonl", switches.trace_step))
    recorder = None
    if switches.diag:
        from twinrun.diag.recorder import DiagRecorder
        from twinrun.train.hooks.diag import DiagHook

        recorder = DiagRecorder(s.out / "diag.jsonl", append=switches.resume) if root else None
        hooks.append(DiagHook(recorder))
    hooks.append(NonFiniteHook(checkpointer))
    if switches.capture and root:
        from twinrun.train.hooks.capture import capture_hook

        hooks.append(capture_hook(s, total_steps))
    if s.eval_rows:
        from twinrun.train.hooks.evaluation import EvaluationHook

        every = run.record(Evaluation).eval_every
        hooks.append(EvaluationHook(s, s.eval_rows, every, recorder))
    if switches.checkpoint_every:
        hooks.append(CheckpointHook(checkpointer, switches.checkpoint_every))
    if switches.report_to and root:  # --report-to: trackers read each complete row, offline
        hooks.append(ReportHook(switches.report_to, s.out, s.shaping()))
    # last: it stops the run once every other hook has written the step out
    hooks.append(InterruptHook(checkpointer if switches.checkpoint_every else None))
    return hooks


def build_loop(
    run: ValidRun,
    params: Params,
    total_steps: int,
    hooks: list[Hook],
    faults: Faults | None = None,
    progress: Progress | None = None,
) -> Loop:
    """The one place a step loop is built — for training and for the replay of a captured step
    alike, so the two cannot compute a step differently: the optimizer and the schedule, and
    the loop's policies (its backward, gradient parts and combination, spike rerun and planted
    stray draw), all chosen from the run's settings. `faults`: the run's planted faults (a
    replay plants none)."""
    run = run.with_warmup(total_steps)  # --warmup-ratio's steps, now that the run's are known
    opt, switches = run.optimizer, run.switches
    assert run.warmup_steps is not None  # with_warmup made them
    check_schedule(run.warmup_steps, total_steps, run.lr_schedule, opt.decay_steps)
    planted = {fault for fault, _ in faults.planted} if faults is not None else set()
    backward: BackwardPolicy = PlainBackward()
    if "reduction" in planted:
        assert faults is not None
        backward = ReductionFault(faults)
    combine: GradientCombiner = LocalSum()
    if distributed.active():  # per-forward gradients of every process, in global order
        from twinrun.train.parallel.gather import OrderedGather

        combine = OrderedGather()
    spike = None
    if switches.spike_factor is not None and switches.spike_window is not None:
        spike = SpikeRerun(switches.spike_factor, switches.spike_window, progress)
    optimizer = make_optimizer(
        params, run.learning_rate, opt.adam_betas, opt.adam_eps, opt.weight_decay
    )
    return Loop(
        params=params,
        optimizer=optimizer,
        base_lr=run.learning_rate,
        warmup_steps=run.warmup_steps,
        total_steps=total_steps,
        hooks=hooks,
        backward=backward,
        parts=RowParts() if run.backend.batch_invariant else WholeForward(),
        combine=combine,
        spike=spike,
        stray_draw=StrayDraw(faults) if faults is not None and "rng" in planted else None,
        schedule=run.lr_schedule,
        decay_steps=opt.decay_steps,
        stop_after=switches.stop_after,
        max_grad_norm=opt.max_grad_norm,
        progress=progress,
    )


def drive(
    s: Session, loop: Loop, recipe: StepRecipe[P, B], objective: ObjectiveState | None = None
) -> None:
    """Run the loop's steps (from the newest checkpoint with --resume), then close the hooks."""
    switches = s.run.switches
    start = 0
    if switches.resume:
        ckpt = newest_checkpoint(s.out)
        assert ckpt is not None  # checked when the session opened
        check_same_run(ckpt.state["train"], s.shaping())
        restore(ckpt, loop.params, loop.optimizer)
        loop.metrics = list(ckpt.state["metrics"])
        if objective is not None:
            objective.set(ckpt.state.get("objective", {}))
        start = ckpt.steps_done
        if loop.progress is not None:
            loop.progress.note(
                f"resuming {s.out} with {start} of {loop.total_steps} steps done ({ckpt.path.name})"
            )
    # a sharded base's forwards and backwards are collectives (FSDP's all-gathers): a peer that
    # died fails them, which is one line like any other collective's, not an internal error
    sharded = distributed.collective("a step of the sharded base") if s.model.sharded else None
    interrupt = next(h for h in loop.hooks if isinstance(h, InterruptHook))
    with stop_signals(interrupt):  # the hooks close in it too: a signal after a stop is absorbed
        try:
            with sharded or contextlib.nullcontext():
                loop.run(recipe, start, switches.prefetch)
        except interrupts.StopNow as stop:  # the step under way is abandoned: it writes nothing
            raise interrupt.abandoned(stop.name, loop.total_steps) from None
        finally:
            if loop.progress is not None:
                loop.progress.close()
            for hook in loop.hooks:
                hook.close()


def spikes_of(loop: Loop) -> list[dict[str, Any]]:
    """The spike reruns of the run (empty without --spike-factor)."""
    return list(loop.spike.spikes) if loop.spike is not None else []


def truncate_logs(out: Path, steps_done: int) -> None:
    """Keep only the train and eval rows of steps before `steps_done` in diag/trace logs (a
    killed run may have logged steps past its last checkpoint)."""
    for name in LOGS:
        path = out / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line from the kill
            phase = row.get("phase", "train")
            if phase not in ("train", "eval") or int(row.get("step", -1)) < steps_done:
                kept.append(line)
        atomic_write_text(path, "".join(line + "\n" for line in kept))
