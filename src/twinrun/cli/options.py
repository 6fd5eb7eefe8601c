"""Shared click options. Training numbers have no defaults at the click level: a missing one is
reported (with every other missing one) by config validation, in one error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def _stack(*decorators: F) -> F:
    def apply(fn: F) -> F:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return apply


def common_train_options(fn: F) -> F:
    return _stack(
        click.option("--model", type=str, help="Local Hugging Face checkpoint directory."),
        click.option("--examples", type=str, help="Examples: JSONL or a JSON array."),
        click.option("--output", type=str, help="Run directory to write."),
        click.option("--seed", type=int, help="Seed in [0, 2**63): fixes the whole run."),
        click.option("--batch-size", type=int, help="Rows per forward."),
        click.option("--learning-rate", type=float, help="Peak learning rate (AdamW)."),
        click.option("--warmup-steps", type=int, help="Linear warmup steps (then cosine to 0)."),
        click.option("--lora-rank", type=int, help="LoRA rank r."),
        click.option("--lora-alpha", type=float, help="LoRA alpha (scaling alpha / r)."),
        click.option("--precision", type=str, help="f32 | bf16 (f32 casts nothing)."),
        click.option("--chat-template", type=str, help="on | off."),
        click.option("--diag", is_flag=True, help="Write diag.jsonl (per-step checksums)."),
        click.option("--trace-step", type=int, help="Also record per-module checksums at step K."),
        click.option("--inject", multiple=True, help="Plant a fault: FAULT@STEP (testing)."),
        click.option("--threads", type=int, help="torch threads (recorded)."),
        click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0."),
        click.option(
            "--strict/--no-strict",
            default=True,
            show_default=True,
            help="Strict deterministic mode.",
        ),
        click.option("--batch-invariant", is_flag=True, help="Row results independent of batch."),
        click.option("--checkpoint-every", type=int, help="Write a checkpoint every N steps."),
        click.option(
            "--resume", is_flag=True, help="Continue --output from its newest checkpoint."
        ),
        click.option(
            "--prefetch",
            type=int,
            default=0,
            show_default=True,
            help="Batches prepared ahead on a background thread.",
        ),
        click.option("--spike-factor", type=float, help="Rerun a step whose loss > F x median."),
        click.option("--spike-window", type=int, help="Steps in the spike median."),
        click.option("--init-adapter", type=str, help="Start from this adapter (init-adapter)."),
        click.option("--overwrite", is_flag=True, help="Replace an existing run directory."),
        click.option("--quiet", is_flag=True, help="No progress output."),
    )(fn)


def epoch_options(fn: F) -> F:
    return _stack(
        click.option("--epochs", type=int, help="Passes over the examples."),
        click.option("--accumulation", type=int, help="Forwards per optimizer step."),
    )(fn)


def config_from_options(objective: str, opts: dict[str, Any]) -> Any:
    from twinrun.config.run import RunConfig

    values = dict(opts)
    values["inject"] = list(values.get("inject") or [])
    return RunConfig(objective=objective, **values)
