"""Build a run's step loop with its policies and hooks, and drive it: resume from the newest
checkpoint, run the steps, close what the hooks opened. Shared by every objective.

`make_loop` is where a reader sees how this run's step is computed (the loop's backward,
gradient combination, spike rerun and planted stray draw) and which hooks observe it; each hook
declares its points and phases itself (train/loop.py says what they are).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from twinrun.config.resolved import Evaluation
from twinrun.config.schedule import check_schedule
from twinrun.core.fileio import atomic_write_text
from twinrun.core.progress import Progress
from twinrun.train import distributed
from twinrun.train.checkpoint import check_same_run, newest_checkpoint, restore, resume_point
from twinrun.train.hooks.checkpoint import Checkpointer, CheckpointHook, ObjectiveState
from twinrun.train.hooks.nonfinite import NonFiniteHook
from twinrun.train.hooks.report import ReportHook
from twinrun.train.interrupt import InterruptHook, stop_signals
from twinrun.train.loop import (
    B,
    BackwardPolicy,
    GradientCombiner,
    Hook,
    LocalSum,
    Loop,
    PlainBackward,
    Recipe,
    WholeForward,
    make_optimizer,
)
from twinrun.train.policies import ReductionFault, RowParts, SpikeRerun, StrayDraw
from twinrun.train.session import Session

LOGS = ("diag.jsonl", "trace.jsonl")

__all__ = ["ObjectiveState", "drive", "make_loop", "spikes_of", "truncate_logs"]


def make_loop(s: Session, total_steps: int, objective: ObjectiveState | None = None) -> Loop:
    """The loop of this run: its policies, and the hooks that observe it."""
    run, cfg = s.run, s.cfg
    check_schedule(run.warmup_steps, total_steps, run.lr_schedule, cfg.decay_steps)
    progress = Progress(total_steps, f"{cfg.objective} step", quiet=cfg.quiet)
    root = distributed.is_root()
    if cfg.resume and root:
        truncate_logs(s.out, resume_point(s.out))
    planted = {fault for fault, _ in s.faults.planted}
    backward: BackwardPolicy = PlainBackward()
    if "reduction" in planted:
        backward = ReductionFault(s.faults)
    combine: GradientCombiner = LocalSum()
    if distributed.active():  # per-forward gradients of every process, in global order
        from twinrun.train.gather import OrderedGather

        combine = OrderedGather()
    spike = None
    if cfg.spike_factor is not None and cfg.spike_window is not None:
        spike = SpikeRerun(cfg.spike_factor, cfg.spike_window, progress)
    hooks: list[Hook] = []
    checkpointer = Checkpointer(s.out, s.shaping(), objective, flush=hooks)
    if cfg.trace_step is not None:
        from twinrun.train.hooks.trace import TraceHook

        hooks.append(TraceHook(s.model, s.out / "trace.jsonl", cfg.trace_step))
    recorder = None
    if cfg.diag:
        from twinrun.diag.recorder import DiagRecorder
        from twinrun.train.hooks.diag import DiagHook

        recorder = DiagRecorder(s.out / "diag.jsonl", append=cfg.resume) if root else None
        hooks.append(DiagHook(recorder))
    hooks.append(NonFiniteHook(checkpointer))
    if cfg.capture and root:
        from twinrun.train.hooks.capture import capture_hook

        hooks.append(capture_hook(s, total_steps))
    if s.eval_rows:
        from twinrun.train.hooks.evaluation import EvaluationHook

        every = run.record(Evaluation).eval_every
        hooks.append(EvaluationHook(s, s.eval_rows, every, recorder))
    if cfg.checkpoint_every:
        hooks.append(CheckpointHook(checkpointer, cfg.checkpoint_every))
    if cfg.report_to and root:  # --report-to: trackers read each complete row, offline
        hooks.append(ReportHook(cfg.report_to, s.out, s.shaping()))
    # last: it stops the run once every other hook has written the step out
    hooks.append(InterruptHook(checkpointer if cfg.checkpoint_every else None))
    optimizer = make_optimizer(
        s.params, run.learning_rate, cfg.adam_betas, cfg.adam_eps, cfg.weight_decay
    )
    return Loop(
        params=s.params,
        optimizer=optimizer,
        base_lr=run.learning_rate,
        warmup_steps=run.warmup_steps,
        total_steps=total_steps,
        hooks=hooks,
        backward=backward,
        parts=RowParts() if cfg.batch_invariant else WholeForward(),
        combine=combine,
        spike=spike,
        stray_draw=StrayDraw(s.faults) if "rng" in planted else None,
        schedule=run.lr_schedule,
        decay_steps=cfg.decay_steps,
        stop_after=cfg.stop_after,
        progress=progress,
    )


def drive(
    s: Session, loop: Loop, recipe: Recipe[B], objective: ObjectiveState | None = None
) -> None:
    """Run the loop's steps (from the newest checkpoint with --resume), then close the hooks."""
    cfg = s.cfg
    start = 0
    if cfg.resume:
        ckpt = newest_checkpoint(s.out)
        assert ckpt is not None  # checked when the session opened
        check_same_run(ckpt.state["train"], s.shaping())
        restore(ckpt, loop.params, loop.optimizer)
        loop.metrics = list(ckpt.state["metrics"])
        if objective is not None:
            objective.set(ckpt.state.get("objective", {}))
        start = ckpt.steps_done
        if loop.progress is not None:
            loop.progress.note(f"resuming {s.out} after step {start - 1} ({ckpt.path.name})")
    # a sharded base's forwards and backwards are collectives (FSDP's all-gathers): a peer that
    # died fails them, which is one line like any other collective's, not an internal error
    sharded = distributed.collective("a step of the sharded base") if s.model.sharded else None
    interrupt = next(h for h in loop.hooks if isinstance(h, InterruptHook))
    try:
        with sharded or contextlib.nullcontext(), stop_signals(interrupt):
            loop.run(recipe, start, cfg.prefetch)
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
