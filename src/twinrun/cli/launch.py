"""`twinrun launch`: torchrun's arguments, torchrun's launch, and a refusal read as one line."""

from __future__ import annotations

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    add_help_option=False,
)
@click.argument("torchrun_args", nargs=-1, type=click.UNPROCESSED)
def launch(torchrun_args: tuple[str, ...]) -> int:
    """torchrun, with torchrun's arguments: `twinrun launch --standalone --nproc-per-node 2 -m
    twinrun tune sft ...`. A process that refuses prints its one line and the launch exits with
    its status, without torchrun's 40-line report."""
    from twinrun.train.parallel.launcher import launch as run_launch

    code, line = run_launch(list(torchrun_args))
    if line is not None:  # a process's line, redacted when it was written
        click.echo(line, err=True)
    return code
