"""`twinrun demo`: the guided tour — reproduce, learn, diverge and diagnose, capture and replay,
check — on the embedded toy model and shipped examples, or on a checkpoint given with --model."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option(
    "--dir", "directory", default="twinrun-demo", show_default=True,
    help="Where the demo writes (a rerun replaces what the tour wrote there, nothing else).",
)  # fmt: skip
@click.option(
    "--model", type=click.Path(file_okay=False), default=None,
    help="Run the tour on this Hugging Face checkpoint instead of the toy model.",
)  # fmt: skip
@click.option(
    "--threads", type=click.IntRange(min=1), default=1, show_default=True,
    help="torch threads (one is fastest for the toy model).",
)  # fmt: skip
def demo(directory: str, model: str | None, threads: int) -> None:
    """Reproduce, learn, diagnose, replay and check, each step saying what it proved."""
    from twinrun.demo.tour import run_demo

    run_demo(Path(directory), threads=threads, model=Path(model) if model else None)
