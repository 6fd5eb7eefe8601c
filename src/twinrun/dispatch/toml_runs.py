"""`twinrun run CONFIG.toml`: a TOML config to its trainer (DESIGN §5).

`[logging] dir` is the run directory: the trainer's files (DESIGN §4), the captures, `final/`
(the final adapter) and `resolved_config.json` (the redacted resolved config). A source capture
is checked before anything is written:

- v1 (`capture = true`): it starts from an initialization state (`[resume] from` with
  `trainer_state.json` step -1, as `twinrun init-adapter` writes), runs exactly one step
  (`max_steps = 1`), writes no checkpoints (`save_every = 0`) on one device — anything else
  fails closed;
- `capture_steps = [k, ...]`: any run; each k must be a step the run performs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinrun.config.toml import EPOCH_TRAINERS, TomlRun, load_toml, resolved_tree
from twinrun.core.errors import ConfigError, TwinrunError
from twinrun.core.fileio import atomic_write_bytes, atomic_write_json

RESOLVED = "resolved_config.json"
FINAL = "final"
FINAL_FILES = ("adapter_model.safetensors", "adapter_config.json", "reward_head.safetensors")


def planned_steps(run: TomlRun) -> int:
    """The optimizer steps the run will take (epoch trainers: from the examples count)."""
    cfg = run.cfg
    if run.trainer in ("grpo", "text"):
        return int(cfg.steps)  # type: ignore[arg-type]
    from twinrun.data.batching import steps_per_epoch
    from twinrun.data.examples import load_rows

    n = len(load_rows(cfg.examples))  # type: ignore[arg-type]
    return cfg.epochs * steps_per_epoch(n, cfg.batch_size, cfg.accumulation)  # type: ignore[arg-type,operator]


def source_problems(run: TomlRun) -> list[str]:
    """What stops this (non-replay) config from running as declared."""
    cfg = run.cfg
    problems: list[str] = []
    total = planned_steps(run)
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
    from twinrun.train.init_adapter import read_trainer_state

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


def run_toml(path: str | Path, output: str | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run a TOML config; returns the run's sidecar record."""
    run = load_toml(path, output)
    run.cfg.quiet = quiet
    if run.trainer == "optimizer_replay":
        from twinrun.replay.runner import replay
        from twinrun.train.distributed import launched

        if launched() and os.environ.get("WORLD_SIZE") != "1":
            raise ConfigError(
                f"{path}: an optimizer replay runs in one process, not under torchrun",
                "run it as `twinrun run CONFIG.toml` (a capture from any process count replays)",
            )
        return replay(run)
    problems = source_problems(run)
    if problems:
        hint = "see docs/capture.md (capture a source step)"
        raise ConfigError(f"{path}: " + "; ".join(problems), hint)
    cfg = run.cfg
    if run.trainer == "sft":
        from twinrun.train.recipes.sft import train_sft

        record = train_sft(cfg)
    elif run.trainer == "grpo":
        from twinrun.train.recipes.grpo import train_grpo

        record = train_grpo(cfg)
    elif run.trainer == "text":
        from twinrun.train.recipes.text import train_text

        record = train_text(cfg)
    else:
        from twinrun.train.recipes.pairs import train_pairs

        record = train_pairs(cfg, run.trainer)
    if not record:  # a process of a data-parallel run other than rank 0: it writes nothing
        return record
    out = Path(cfg.output)  # type: ignore[arg-type]
    for name in FINAL_FILES:
        if (out / name).is_file():
            atomic_write_bytes(out / FINAL / name, (out / name).read_bytes())
    atomic_write_json(out / RESOLVED, resolved_tree(run))
    return record
