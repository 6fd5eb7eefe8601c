"""`twinrun plot RUN... --output FILE.png`: loss, learning-rate, gradient-norm and reward curves
of one or more runs, from their metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("plot")
@click.argument("runs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--output", required=True, type=click.Path(), help="PNG to write.")
@click.option("--overwrite", is_flag=True, help="Replace a PNG an earlier twinrun plot wrote.")
def plot(runs: tuple[str, ...], output: str, overwrite: bool) -> None:
    """Draw the training curves of RUNS (one line per run) into a PNG."""
    from twinrun.diag.curves import write_curves

    drawn = write_curves([Path(r) for r in runs], output, overwrite)
    click.echo(f"plot: {output} ({', '.join(drawn)} of {len(runs)} run(s))")
