"""Training curves of one or more runs as a PNG (`twinrun plot RUN... --output FILE`).

One panel per metric that any run's `metrics.jsonl` has — `loss`, `lr`, `grad_norm`,
`reward_mean` (GRPO), `eval_loss` (with `--eval-examples`), in that order — against the optimizer
step, one line per run labelled by its directory name. Rows of other phases and non-finite values
are left out (a NaN loss shows as a gap). matplotlib's Agg backend draws it without a display;
the file is written atomically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError
from twinrun.core.fileio import atomic_write_with

CURVES = ("loss", "lr", "grad_norm", "reward_mean", "eval_loss")


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the rows that have it as a finite number."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if row.get("phase", "train") != "train":
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value) and isinstance(row.get("step"), int):
                steps.append(int(row["step"]))
                values.append(float(value))
    return steps, values


def write_curves(runs: list[Path], out: str | os.PathLike[str]) -> list[str]:
    """Draw the curves of `runs` into the PNG `out`; returns the metrics drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from twinrun.core.paths import output_file
    from twinrun.diag.metrics_file import read_metrics

    output_file(out, overwrite=True)  # a link, a directory or an unwritable place: refused

    hint = "name run directories a training command wrote"
    table = {run: read_metrics(run, hint) for run in runs}
    keys = [k for k in CURVES if any(series(rows, k)[0] for rows in table.values())]
    if not keys:
        raise DataError(
            f"no run of {', '.join(map(str, runs))} has a {' / '.join(CURVES)} value to plot",
            "name run directories a training command wrote",
        )
    fig = Figure(figsize=(5.5 * len(keys), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys, strict=True):
        for run, rows in table.items():
            steps, values = series(rows, key)
            if steps:
                ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=run.name)
        ax.set_title(key)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    atomic_write_with(
        out, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    )
    return keys
