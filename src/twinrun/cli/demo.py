"""`twinrun demo`: the guided tour on embedded defaults — toy model, shipped examples, three SFT
runs (two at one seed, one at another), evaluate and generate."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--dir",
    "directory",
    default="twinrun-demo",
    show_default=True,
    help="Where the demo writes (its own subdirectories are replaced on a rerun).",
)
@click.option(
    "--threads",
    type=int,
    default=1,
    show_default=True,
    help="torch threads (one is fastest for the toy model).",
)
def demo(directory: str, threads: int | None) -> None:
    """Show that a run reproduces itself, on the toy model and shipped examples."""
    from twinrun.demo.tour import run_demo

    run_demo(Path(directory), threads=threads)
