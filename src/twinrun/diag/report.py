"""The `twinrun diff --report FILE.png` heatmap: leaves (dataflow order, top to bottom) × rows
(steps, in comparison order), colour = log10 of the relative difference of the checksums.

Equal cells are drawn at the floor (1e-17), cells where a run lacks the leaf or the row are drawn
in the "over" colour, cells neither run has are grey; the first divergence is outlined in red.
More rows than `max_columns` are binned (the maximum of each bin is drawn). matplotlib is
imported only here, with the Agg canvas (no display, no global pyplot state), and the PNG is
written atomically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from twinrun.core.fileio import atomic_write_with
from twinrun.core.ledger import note_written

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from twinrun.diag.compare import CompareResult, DiffMatrix

__all__ = ["DIFF_PICTURE", "SOFTWARE", "claim_report", "write_report"]
SOFTWARE = "twinrun diff"
DIFF_PICTURE = "diff.png"  # `twinrun diff --report` into a run (the tour's faulty/diff.png)


def claim_report(path: str | os.PathLike[str], overwrite: bool, runs: tuple[str, ...]) -> None:
    """Before any comparison: `--report` is not a link, a directory, one of the runs' files or
    another program's file; an existing one goes only with `overwrite` (its PNG text says
    `twinrun diff` wrote it)."""
    from twinrun.core.owned import claim_file, png_signed

    claim_file(
        path, overwrite, SOFTWARE, png_signed(SOFTWARE), what="--report",
        inputs={f"run {r}": r for r in runs}, allowed_names=(DIFF_PICTURE,),
    )  # fmt: skip


FLOOR = 1e-17


def _label(phase: str, step: int) -> str:
    return str(step) if phase == "train" else f"{phase}:{step}"


def write_report(
    result: CompareResult, path: str | os.PathLike[str], *, max_columns: int = 2000
) -> Path:
    """Draw the heatmap of `result` (from `compare(..., keep_matrix=True)`) to a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if result.matrix is None:
        raise ValueError("write_report needs compare(..., keep_matrix=True)")
    m = result.matrix
    rel, div, k = _binned_cells(m, max_columns)
    img = _log_image(rel)

    n_cols, n_leaves = rel.shape[0], rel.shape[1]
    fig = Figure(figsize=(min(16.0, 6.5 + 0.08 * n_cols), 2.2 + 0.35 * max(n_leaves, 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    _draw_heatmap(fig, ax, img)
    _draw_ticks(ax, m, n_cols, k)

    if n_cols * n_leaves <= 4000:  # mark divergent cells (also digest-only ones at the floor)
        _mark_divergent(ax, div)

    ax.set_title(_outline_first(ax, result, m, k, n_leaves), fontsize=8)
    fig.tight_layout()

    out = Path(path)
    meta = {"Software": SOFTWARE}  # what a later --overwrite checks before replacing
    note_written(out, root=Path(out).parent)  # beside a run's files: in its list
    atomic_write_with(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110, metadata=meta))
    return out


def _binned_cells(m: DiffMatrix, max_columns: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows × leaves relative differences and divergence marks of `m`, with consecutive
    rows binned k at a time when there are more than `max_columns` of them; and k."""
    import numpy as np

    rel = np.array(m.rel, dtype=np.float64).reshape(len(m.rows), len(m.leaves))
    div = np.array(m.diverged, dtype=bool).reshape(rel.shape)
    n_rows = rel.shape[0]
    k = max(1, math.ceil(n_rows / max_columns))
    if k > 1:  # bin consecutive rows: the largest difference of each bin is what shows
        pad = (-n_rows) % k
        r = np.pad(rel, ((0, pad), (0, 0)), constant_values=np.nan).reshape(-1, k, rel.shape[1])
        all_nan = np.isnan(r).all(axis=1)
        rel = np.where(all_nan, np.nan, np.nanmax(np.where(np.isnan(r), -1.0, r), axis=1))
        d = np.pad(div, ((0, pad), (0, 0))).reshape(-1, k, div.shape[1])
        div = np.asarray(d.any(axis=1))
    return rel, div, k


def _log_image(rel: np.ndarray) -> np.ndarray:
    """The leaves × columns image: log10 of `rel` clipped at the floor, missing cells above
    the colour scale."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        img = np.log10(np.clip(rel, FLOOR, None))
    img[np.isinf(rel)] = 1.0  # missing leaf or row: above the colour scale
    return img.T  # leaves × columns


def _draw_heatmap(fig: Figure, ax: Axes, img: np.ndarray) -> None:
    """Draw `img` on `ax` with its colour bar (grey where no run has the cell, red above)."""
    import matplotlib
    from matplotlib.colors import Normalize

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9", over="#d62728")
    norm = Normalize(vmin=math.log10(FLOOR), vmax=0.0)
    im = ax.imshow(img, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    cb = fig.colorbar(im, ax=ax, extend="max")
    cb.set_label("log10 relative difference")


def _draw_ticks(ax: Axes, m: DiffMatrix, n_cols: int, k: int) -> None:
    """Label the leaves (y) and up to 12 columns by their first row's step (x)."""
    import numpy as np

    n_rows = len(m.rows)
    ax.set_yticks(range(len(m.leaves)))
    ax.set_yticklabels(m.leaves, fontsize=8)
    ticks = sorted({int(i) for i in np.linspace(0, max(n_cols - 1, 0), num=min(n_cols, 12))})
    ax.set_xticks(ticks)
    ax.set_xticklabels([_label(*m.rows[min(i * k, n_rows - 1)]) for i in ticks], fontsize=8)
    ax.set_xlabel("step" + (f" (bins of {k} rows)" if k > 1 else ""))


def _mark_divergent(ax: Axes, div: np.ndarray) -> None:
    """A white cross on every divergent cell."""
    import numpy as np

    ys, xs = np.nonzero(div.T)
    ax.scatter(xs, ys, marker="x", s=12, c="white", linewidths=0.8)


def _outline_first(ax: Axes, result: CompareResult, m: DiffMatrix, k: int, n_leaves: int) -> str:
    """Outline the first divergence in red (its leaf, or the whole column when the row is
    missing) and return the title, which names it (or says the runs are deterministic)."""
    from matplotlib.patches import Rectangle

    title = f"twinrun diff\nA: {result.path_a}\nB: {result.path_b}"
    f = result.first
    if f is not None:
        col = next(i for i, row in enumerate(m.rows) if row == (f.phase, f.step)) // k
        if f.leaf is not None and f.leaf in m.leaves:
            y, h = m.leaves.index(f.leaf) - 0.5, 1.0
        else:
            y, h = -0.5, float(n_leaves)
        ax.add_patch(Rectangle((col - 0.5, y), 1.0, h, fill=False, ec="red", lw=2.0))
        where = f"step={f.step}" + (f" phase={f.phase}" if f.phase != "train" else "")
        title += f"\nfirst divergence: {where} leaf={f.leaf or '(row missing)'}"
    else:
        title += "\ndeterministic"
    return title
