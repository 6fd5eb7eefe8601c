"""`twinrun init OBJECTIVE [--defaults trl]`: write a complete TOML config to edit and run."""

from __future__ import annotations

import click

from twinrun.objectives.registry import names


@click.command("init")
@click.argument("objective", type=click.Choice(names()))
@click.option(
    "--to", "path", required=True, type=click.Path(dir_okay=False),
    help="The TOML file to write (refused if it exists, unless --overwrite).",
)  # fmt: skip
@click.option(
    "--defaults", type=click.Choice(["trl"]), default=None,
    help="trl: write TRL 1.16's defaults for this trainer (PEFT's LoraConfig for the adapter) "
    "for every number, each with where it came from.",
)  # fmt: skip
@click.option("--model", default=None, help="Local checkpoint directory (model.path).")
@click.option("--examples", default=None, help="Examples file (data.examples).")
@click.option("--output", default=None, help="Run directory the config writes (logging.dir).")
@click.option("--overwrite", is_flag=True, help="Replace an existing file at --to.")
def init_config(
    objective: str,
    path: str,
    defaults: str | None,
    model: str | None,
    examples: str | None,
    output: str | None,
    overwrite: bool,
) -> None:
    """Write a TOML config for OBJECTIVE, every setting that applies with its help; then
    `twinrun run FILE`."""
    from pathlib import Path

    from twinrun.config.run import applies
    from twinrun.config.starter import starter_toml
    from twinrun.core.errors import ConfigError
    from twinrun.core.fileio import atomic_write_text

    target = Path(path)
    if target.exists() and not (overwrite and target.is_file()):
        raise ConfigError(
            f"{path} exists" + ("" if target.is_file() else " and is not a file"),
            "choose another --to, or add --overwrite to replace the file",
        )
    if examples is not None and not applies("examples", objective):
        raise ConfigError(f"--examples does not apply to {objective}", "leave it out")
    given = {"model": model, "output": output}
    if applies("examples", objective):
        given["examples"] = examples
    atomic_write_text(target, starter_toml(objective, defaults, **given))
    click.echo(f"{objective} config written to {path}; edit it, then: twinrun run {path}")
