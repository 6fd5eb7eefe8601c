"""What a source run (a TOML config that trains, possibly capturing) must satisfy before it starts,
and the names of the files a TOML run leaves in its directory.

- v1 capture (`capture = true`): it starts from an initialization state (`[resume] from` with
  `trainer_state.json` step -1, as `twinrun init-adapter` writes), runs exactly one step
  (`max_steps = 1`), writes no checkpoints (`save_every = 0`) and does not resume;
- `capture_steps = [k, ...]`: any run; each k must be a step the run performs.

`twinrun run` refuses a config with problems; `twinrun explain` lists them.
"""

from __future__ import annotations

from twinrun.config.resolved import EpochPlan, StepCount
from twinrun.config.toml import EPOCH_TRAINERS, TomlRun
from twinrun.core.errors import TwinrunError

RESOLVED = "resolved_config.json"
FINAL = "final"
FINAL_FILES = ("adapter_model.safetensors", "adapter_config.json", "reward_head.safetensors")


def planned_steps(run: TomlRun, examples: int) -> int:
    """The optimizer steps the run will take (epoch trainers: over `examples`, the count of rows
    the run's input checks read)."""
    valid = run.training()
    if valid.has(StepCount):
        return valid.record(StepCount).steps
    from twinrun.data.batching import steps_per_epoch

    plan = valid.record(EpochPlan)
    return plan.epochs * steps_per_epoch(examples, valid.batch_size, plan.accumulation)


def source_problems(run: TomlRun, examples: int) -> list[str]:
    """What stops this (non-replay) config from running as declared; `examples`: the count of
    rows its input checks read (the steps of an epoch trainer are made from it)."""
    cfg = run.cfg
    problems: list[str] = []
    total = planned_steps(run, examples)
    if run.trainer in EPOCH_TRAINERS and run.max_steps is not None and run.max_steps != total:
        problems.append(
            f"training.max_steps is {run.max_steps} but {run.trainer} plans {total} steps "
            "(epochs x examples / (batch_size x accumulation))"
        )
    if cfg.capture and cfg.capture_steps is None:
        problems += v1_capture_problems(run, total)
    for k in cfg.capture_steps or []:
        if k >= total:
            problems.append(
                f"optimizer_batch.capture_steps: step {k} is past the run's {total} steps"
            )
    return problems


def v1_capture_problems(run: TomlRun, total: int) -> list[str]:
    from twinrun.capture.state import read_trainer_state

    cfg = run.cfg
    problems = []
    if cfg.init_adapter is None:
        problems.append("a v1 capture starts from [resume] from = an init-adapter state")
    else:
        try:
            step = read_trainer_state(cfg.init_adapter)["step"]
        except TwinrunError as exc:
            problems.append(exc.message)
        else:
            if step != -1:
                problems.append(
                    f"{cfg.init_adapter} is a completed checkpoint (step {step}); a v1 capture "
                    "starts only from an initialization state (step -1, `twinrun init-adapter`)"
                )
    if total != 1 or run.max_steps != 1:
        problems.append(
            f"a v1 capture runs exactly one step: set training.max_steps = 1 "
            f"(the run plans {total})"
        )
    if cfg.checkpoint_every != 0:
        problems.append("a v1 capture writes no checkpoints: set training.save_every = 0")
    if cfg.resume:
        problems.append("a v1 capture cannot resume a run")
    return problems
