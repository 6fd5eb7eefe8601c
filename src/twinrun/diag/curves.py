"""Training curves of one or more runs as a PNG (`twinrun plot RUN... --output FILE`).

One panel per metric that any run's `metrics.jsonl` has — `loss`, `lr`, `grad_norm`,
`reward_mean` (GRPO), `eval_loss` (with `--eval-examples`), in that order — against the optimizer
step, one line per run labelled by its directory name (a `$` in it stays a `$`), a run in one
colour and line style in every panel, one legend under them all. Rows of other
phases, non-finite values and magnitudes above 1e300 (which no axis can span) are left out (a NaN
loss shows as a gap). matplotlib's Agg backend draws it without a display; the file is written
atomically, and says inside that `twinrun plot` wrote it (what a later `--overwrite` checks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError
from twinrun.core.fileio import atomic_write_with
from twinrun.core.ledger import note_written

CURVES = ("loss", "lr", "grad_norm", "reward_mean", "eval_loss")


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the rows that have it as a finite number."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if row.get("phase", "train") != "train":
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            if abs(value) <= DRAWABLE and isinstance(row.get("step"), int):
                steps.append(int(row["step"]))
                values.append(float(value))
    return steps, values


CURVES_PICTURE = "curves.png"  # `twinrun plot` into a run (the tour's run-a/curves.png)
SOFTWARE = "twinrun plot"  # the PNG's Software text: what --overwrite checks before replacing
DRAWABLE = 1e300  # larger magnitudes overflow the axis arithmetic (a range of 2e308 is inf)


def run_name(i: int, n: int) -> str:
    """How an error names run i of n: "run", or "run 2" among several."""
    return "run" if n == 1 else f"run {i + 1}"


def label(run: Path) -> str:
    """The legend text of `run`: its name, with `$` escaped (no mathtext from a file name)."""
    return run.name.replace("$", r"\$")


LINE_STYLES = ("-", "--", ":", "-.")  # run i: colour i, style i: identical runs stay visible


def draw_curves(table: dict[Path, list[dict[str, Any]]], keys: list[str]) -> Any:
    """The figure: one panel per key, run i drawn in the same colour and line style in every
    panel (colour i of matplotlib's cycle, style i mod 4, a thinner line for each later run so
    identical runs stay visible one over the other), and one legend for all the panels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(5.5 * len(keys), 3.9), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    colours = [f"C{i % 10}" for i in range(len(table))]
    looks: list[dict[str, Any]] = [
        {"color": colours[i], "linestyle": LINE_STYLES[i % 4], "linewidth": max(0.8, 2.4 - 0.4 * i)}
        for i in range(len(table))
    ]
    for ax, key in zip(axes, keys, strict=True):
        for look, (run, rows) in zip(looks, table.items(), strict=True):
            steps, values = series(rows, key)
            if steps:
                marker = "." if len(steps) < 50 else None
                ax.plot(steps, values, marker=marker, label=label(run), **look)
        ax.set_title(key)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], **look) for look in looks]
    fig.legend(handles, [label(run) for run in table], loc="outside right upper",
               fontsize="small")  # fmt: skip
    return fig


def write_curves(
    runs: list[Path], out: str | os.PathLike[str], overwrite: bool = False
) -> list[str]:
    """Draw the curves of `runs` into the PNG `out`; returns the metrics drawn. An existing
    `out` is replaced only with `overwrite` and only when `twinrun plot` wrote it; `out` is
    never one of the runs' files."""
    from twinrun.core.owned import claim_file, png_signed
    from twinrun.diag.metrics_file import read_metrics

    claim_file(  # a link, a directory, an unwritable place, an input, another's file: refused
        out, overwrite, SOFTWARE, png_signed(SOFTWARE),
        inputs={run_name(i, len(runs)): r for i, r in enumerate(runs)},
        allowed_names=(CURVES_PICTURE,),
    )  # fmt: skip

    hint = "name run directories a training command wrote"
    table = {run: read_metrics(run, hint) for run in runs}
    keys = [k for k in CURVES if any(series(rows, k)[0] for rows in table.values())]
    if not keys:
        raise DataError(
            f"no run of {', '.join(map(str, runs))} has a {' / '.join(CURVES)} value to plot",
            "name run directories a training command wrote",
        )
    fig = draw_curves(table, keys)
    note_written(out, root=Path(out).parent)  # beside a run's files: in its list
    atomic_write_with(
        out, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata={"Software": SOFTWARE})
    )
    return keys
