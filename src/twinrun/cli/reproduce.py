"""`twinrun reproduce RUN_DIR --output DIR`: re-run a recorded run from its sidecar alone and
say whether it reproduced bit for bit. Exit 0 reproduced, 1 diverged, 2 could not run."""

from __future__ import annotations

import click


@click.command("reproduce")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--output", required=True, type=str, help="Directory for the re-run.")
@click.option("--overwrite", is_flag=True, help="Replace an existing re-run directory.")
@click.option("--progress", is_flag=True, help="Show the re-run's progress bar.")
@click.option(
    "--env",
    "env",
    default=None,
    type=str,
    help="Confirm the environment plugin the run recorded (module.path:factory): a run "
    "directory is data, so reproduce runs the plugin its twinrun.json names only when you name "
    "the same one here.",
)
def reproduce(run_dir: str, output: str, overwrite: bool, progress: bool, env: str | None) -> None:
    """Re-run RUN_DIR from its twinrun.json: same settings, inputs (checked by SHA256) and
    CPU kernels. Reproduced (0), diverged (1: the facts that differ and the first divergence)
    or could not run (2: which input moved or is missing)."""
    from twinrun.dispatch.reproduce import reproduce as run

    result = run(run_dir, output, quiet=not progress, overwrite=overwrite, env=env)
    click.echo(result.headline)
    for line in result.lines:
        click.echo(line)
    raise click.exceptions.Exit(result.exit_code)
