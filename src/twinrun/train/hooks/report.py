"""`--report-to tensorboard|wandb|mlflow`: each optimizer step's metrics row, also sent to an
experiment tracker (on rank 0, once the row is complete).

Each backend is an optional package, imported only when a run's first step is logged. Whether it
is installed is checked with the run's settings (`check_report_to`, config/run.py: `validate`
calls it, so a run without the package stops before anything is written, in one line saying what
to install; it lives there because the session may not import the hooks). What a backend writes,
under the run directory `OUT` and never over the network:

    tensorboard  OUT/tensorboard: `train/<field>` scalars (torch.utils.tensorboard)
    wandb        OUT/wandb: an offline run, its config the sidecar's `train` section
    mlflow       OUT/mlruns: a local file store, its params the sidecar's `train` section

A row's numeric fields are logged (ints and floats; not bools or strings), at the row's `step`.
The config and params are the run's shaping numbers as the sidecar records them (redacted),
never the command line or the environment. The hook only reads: no byte of the run changes.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from twinrun.config.run import REPORT_BACKENDS, check_report_to, report_backends
from twinrun.train.step.loop import Hook, Phase, StepView

__all__ = ["ReportHook", "check_report_to", "flat_params", "numeric_fields"]


def flat_params(shaping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The shaping numbers as mlflow params: nested tables as dotted keys, every value a string
    (a string as it is, anything else as compact JSON)."""
    out: dict[str, str] = {}
    for key, value in shaping.items():
        if isinstance(value, Mapping):
            out |= flat_params(value, f"{prefix}{key}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            out[f"{prefix}{key}"] = text
    return out


def numeric_fields(row: Mapping[str, Any]) -> dict[str, float | int]:
    """The row's numbers (not bools, not strings), without `step`."""
    return {
        k: v
        for k, v in row.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


class Writer(Protocol):
    def log(self, fields: dict[str, float | int], step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class WritesAsItLogs:
    """A backend with nothing buffered (wandb offline, mlflow's file store): `flush` has
    nothing to do."""

    def flush(self) -> None:
        return None


class TensorBoardWriter:
    def __init__(self, out: Path, shaping: Mapping[str, Any]) -> None:
        module = importlib.import_module("torch.utils.tensorboard")
        self.writer = module.SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, fields: dict[str, float | int], step: int) -> None:
        for key, value in fields.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbWriter(WritesAsItLogs):
    def __init__(self, out: Path, shaping: Mapping[str, Any]) -> None:
        self.wandb = importlib.import_module("wandb")
        self.wandb.init(
            mode="offline", dir=str(out), project="twinrun", name=out.name, config=dict(shaping)
        )

    def log(self, fields: dict[str, float | int], step: int) -> None:
        self.wandb.log(fields, step=step)

    def close(self) -> None:
        self.wandb.finish()


class MlflowWriter(WritesAsItLogs):
    def __init__(self, out: Path, shaping: Mapping[str, Any]) -> None:
        self.mlflow = importlib.import_module("mlflow")
        self.mlflow.set_tracking_uri((out / "mlruns").resolve().as_uri())
        self.mlflow.start_run(run_name=out.name)
        self.mlflow.log_params(flat_params(shaping))

    def log(self, fields: dict[str, float | int], step: int) -> None:
        self.mlflow.log_metrics(fields, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


WRITERS: dict[str, Callable[[Path, Mapping[str, Any]], Writer]] = {
    "tensorboard": TensorBoardWriter,
    "wandb": WandbWriter,
    "mlflow": MlflowWriter,
}
assert set(WRITERS) == set(REPORT_BACKENDS), "a writer for every backend check_report_to accepts"


class ReportHook(Hook):
    """Sends each complete metrics row to the named backends; each opens at the first step."""

    points = {"after_step": Phase.PERSIST}  # every field of the row added

    def __init__(self, names: Iterable[str], out: Path, shaping: Mapping[str, Any]) -> None:
        self.names = report_backends(names)
        self.out, self.shaping = out, dict(shaping)
        self.writers: list[Writer] | None = None

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        if self.writers is None:
            self.writers = []
            for name in self.names:  # each opened is closed, even if a later one fails
                self.writers.append(WRITERS[name](self.out, self.shaping))
        fields = numeric_fields(row)
        for writer in self.writers:
            writer.log(fields, int(row["step"]))

    def flush(self) -> None:
        for writer in self.writers or []:
            writer.flush()

    def close(self) -> None:
        writers, self.writers = self.writers or [], None
        for writer in writers:
            writer.close()
