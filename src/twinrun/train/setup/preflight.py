"""What a training run reads and writes, checked before torch loads.

`CHECKS` is the one list of a run's input checks, in order; `preflight(run)` runs it, so a
mistake costs no torch, transformers or PEFT import (seconds on a small machine): the planted
faults (`--inject`, each FAULT@STEP of a fault the objective takes), what the run asks of
torchrun's processes (`--shard-base` needs them, `--trace-step` one), the output
directory (when resuming: that it holds something to resume,
`train.resume_check.check_resumable`), the model directory, its `config.json`, tokenizer files
and safetensors weights, the `--device` name, each examples, evaluation examples and corpus file
(read and every row's shape checked as the objective reads it, `run_data`), the schedule over
the steps the examples make, and that an `--init-adapter` is a directory whose weights are a
readable safetensors file of float32 tensors and whose adapter_config.json is a plain LoRA config
of their rank and of the run's `--lora-rank` and `--lora-alpha` (headers and config alone:
`train.init_adapter.check_init_files`).
It returns the run's data as it read it. The commands run it before importing torch and hand
that data to `train`; a library call of `train(run)` runs it first, before the output directory
is locked, as the commands do. A new input check is one function added to `CHECKS`. What needs
a tokenizer or a model (a row's length, the weights' shapes) is checked by the session as it loads
them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from twinrun.config.resolved import (
    EpochPlan,
    Evaluation,
    Examples,
    StepCount,
    ValidRun,
)
from twinrun.config.schedule import check_schedule
from twinrun.core import reading
from twinrun.core.determinism import parse_device
from twinrun.core.errors import ConfigError
from twinrun.data.batching import steps_per_epoch
from twinrun.model.loading import check_model_dir, read_model_config, shard_files
from twinrun.model.tokens import check_tokenizer_files
from twinrun.train.outputs.init_adapter import check_init_files
from twinrun.train.outputs.resume_check import check_resumable
from twinrun.train.outputs.run_dir import check_output_dir, config_inputs
from twinrun.train.parallel.distributed import launched, process_device, several_processes
from twinrun.train.setup.run_data import RawData, read_data, read_eval
from twinrun.train.step.faults import parse_faults


def _readable(path: str, what: str, hint: str, missing: str | None = None) -> None:
    if Path(path).is_dir():  # a `datasets` save_to_disk directory: its reader says the rest
        return
    reading.open_regular(path, what, hint=hint, missing=missing).close()


def preflight(run: ValidRun) -> RawData:
    """OutputError, ModelError, ConfigError or DataError — one line — for the first input of
    `run` that cannot be used: each of `CHECKS` in turn. Returns the run's data as the data check
    read it (`check_data`): what `train` hands the session, so nothing is read twice."""
    read = [data for check in CHECKS if (data := check(run)) is not None]
    return read[0]


def check_faults(run: ValidRun) -> None:
    """Each `--inject` is FAULT@STEP, of a fault the run's objective takes (the session parses
    them again, with the same function, into the faults it plants)."""
    parse_faults(run.switches.inject, run.objective)


def check_output(run: ValidRun) -> None:
    """The run directory can be written (or, with `--resume`, holds a run to continue)."""
    if not run.switches.resume:
        check_output_dir(run.output, run.switches.overwrite, config_inputs(run))
    else:
        check_resumable(Path(run.output))


def check_model_files(run: ValidRun) -> None:
    """The model directory, its config.json, tokenizer files and safetensors weights."""
    check_model_dir(Path(run.model))
    read_model_config(run.model)
    check_tokenizer_files(Path(run.model))
    shard_files(run.model)  # safetensors weights (not pickle only), every shard the index names


def check_processes(run: ValidRun) -> None:
    """What the run asks of torchrun's processes, read from the environment torchrun sets:
    `--shard-base` shards the base across them (and its forwards are not batch-invariant's);
    `--trace-step` traces the forwards of one process."""
    backend = run.backend
    if backend.shard_base and not launched():
        raise ConfigError(
            "--shard-base shards the base across torchrun's processes, and this process was not "
            "started by torchrun",
            "run it as torchrun --nproc-per-node N -m twinrun ..., or leave --shard-base out",
        )
    if backend.shard_base and backend.batch_invariant:
        raise ConfigError(
            "--shard-base does not run with --batch-invariant (its packed forwards call the "
            "layers one by one, outside FSDP's units)",
            "leave one of them out",
        )
    if run.switches.trace_step is not None and several_processes():
        raise ConfigError(
            "--trace-step traces the forwards of one process; under torchrun each process runs "
            "only some of the step's forwards",
            "trace the step in a run without torchrun (its bytes are the same)",
        )


def check_device(run: ValidRun) -> None:
    """The `--device` name (torchrun gives `cuda` each process's index)."""
    parse_device(process_device(run.backend.device))


def check_data(run: ValidRun) -> RawData:
    """The run's data read (`run_data.read_data`: every row's shape checked as the objective
    reads it, or the corpus), the schedule over the steps the examples make, and the evaluation
    examples read (`run_data.read_eval`). Returns the data read, the evaluation rows with it."""
    data = read_data(run)
    check_run_schedule(run, len(data.items) if run.has(Examples) else 0)
    if not run.has(Evaluation):
        return data
    path = run.record(Evaluation).eval_examples
    _readable(path, "examples file", "check the --eval-examples path")
    return dataclasses.replace(data, eval=read_eval(run))


def check_adapter(run: ValidRun) -> None:
    """An `--init-adapter` is a directory whose weights are a readable float32 safetensors file
    and whose adapter_config.json is a plain LoRA config of their rank, the run's rank and
    alpha."""
    if run.build.init_adapter is not None:
        check_init_files(run.build.init_adapter, run.lora_rank, run.lora_alpha)


Check = Callable[[ValidRun], RawData | None]  # the data check returns what it read; others None
# The one list of a run's input checks, in order: `preflight` runs it before torch loads (the
# commands), and `train(run)` runs it first when its caller has not (a library call).
CHECKS: list[Check] = [
    check_faults, check_processes, check_output, check_model_files, check_device, check_data,
    check_adapter,
]  # fmt: skip


def check_run_schedule(run: ValidRun, examples: int) -> ValidRun:
    """The learning-rate schedule fits the run's steps (checked before anything is written):
    `--steps`, or the epochs over its `examples` (pairs for dpo/reward). Returns the run with
    its warm-up in steps (`--warmup-ratio`'s, made from the run's steps)."""
    if run.has(StepCount):
        total = run.record(StepCount).steps
        run = run.with_warmup(total)
        assert run.warmup_steps is not None  # with_warmup made them
        check_schedule(run.warmup_steps, total, run.lr_schedule, run.optimizer.decay_steps)
        return run
    plan = run.record(EpochPlan)
    per_epoch = steps_per_epoch(examples, run.batch_size, plan.accumulation)
    try:
        run = run.with_warmup(plan.epochs * per_epoch)
        assert run.warmup_steps is not None  # with_warmup made them
        check_schedule(run.warmup_steps, plan.epochs * per_epoch, run.lr_schedule,
                       run.optimizer.decay_steps)  # fmt: skip
    except ConfigError as exc:  # say where the step count came from: the data and the batch
        step = run.batch_size * plan.accumulation
        made = (
            f"{examples} examples at --batch-size {run.batch_size} x --accumulation "
            f"{plan.accumulation} make {per_epoch} step(s) an epoch, {plan.epochs} epoch(s)"
        )
        if examples < step:  # the likelier mistake, said first: a step larger than the data
            raise ConfigError(
                f"one step takes {step} examples (--batch-size {run.batch_size} x "
                f"--accumulation {plan.accumulation}) and the data has {examples}: the run "
                f"has {plan.epochs * per_epoch} step(s), and {exc.message}",
                f"give more examples or a smaller --batch-size / --accumulation (or {exc.hint})",
            ) from exc
        raise ConfigError(f"{exc.message} ({made})", exc.hint) from exc
    return run
