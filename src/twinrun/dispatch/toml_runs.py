"""`twinrun run CONFIG.toml`: a TOML config to its trainer (docs/capture.md).

`[logging] dir` is the run directory: the trainer's files, the captures, `final/`
(the final adapter) and `resolved_config.json` (the redacted resolved config). A source capture
is checked before anything is written:

- v1 (`capture = true`): it starts from an initialization state (`[resume] from` with
  `trainer_state.json` step -1, as `twinrun init-adapter` writes), runs exactly one step
  (`max_steps = 1`), writes no checkpoints (`save_every = 0`) on one device — anything else
  fails closed;
- `capture_steps = [k, ...]`: any run; each k must be a step the run performs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twinrun.capture.source import FINAL, FINAL_FILES, RESOLVED, source_problems
from twinrun.config.resolved import ValidRun
from twinrun.config.toml import load_toml, resolved_tree
from twinrun.core.errors import ConfigError
from twinrun.core.fileio import atomic_write_bytes, atomic_write_json


def run_toml(
    path: str | Path,
    output: str | None = None,
    quiet: bool = False,
    loaded: Callable[[ValidRun], None] | None = None,
) -> dict[str, Any]:
    """Run a TOML config; returns the run's sidecar record. `loaded` is given a training run
    once its config is checked, before anything else (the CLI prints its defaults table)."""
    run = load_toml(path, output, quiet=quiet)
    if loaded is not None and run.trainer != "optimizer_replay":
        loaded(run.training())
    if run.trainer == "optimizer_replay":
        from twinrun.replay.runner import replay
        from twinrun.train.parallel.distributed import several_processes

        if several_processes():
            raise ConfigError(
                f"{path}: an optimizer replay runs in one process, not under torchrun",
                "run it as `twinrun run CONFIG.toml` (a capture from any process count replays)",
            )
        return replay(run)
    from twinrun.train.setup.preflight import preflight

    data = preflight(run.training())  # the output, the model and the data, before torch loads
    problems = source_problems(run, len(data.items))
    if problems:
        hint = "see docs/capture.md (capture a source step)"
        raise ConfigError(f"{path}: " + "; ".join(problems), hint)
    from twinrun.train.recipes import train

    record = train(run.training(), data)  # validated, checked and read once, above
    if not record:  # a process of a data-parallel run other than rank 0: it writes nothing
        return record
    out = Path(run.training().output)
    for name in FINAL_FILES:
        if (out / name).is_file():
            atomic_write_bytes(out / FINAL / name, (out / name).read_bytes())
    atomic_write_json(out / RESOLVED, resolved_tree(run))
    return record
