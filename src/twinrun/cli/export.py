"""`twinrun export RUN --output DIR`: the base with the run's adapter merged (PEFT's
`merge_and_unload`), as a transformers checkpoint that loads without PEFT."""

from __future__ import annotations

import click


@click.command("export")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--output", required=True, type=click.Path(), help="Directory to write.")
@click.option(
    "--model", default=None, type=click.Path(file_okay=False),
    help="The base checkpoint (default: the one the run recorded; it must be the same bytes).",
)  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace an earlier export at --output.")
def export(run: str, output: str, model: str | None, overwrite: bool) -> None:
    """Merge RUN's LoRA adapter into its base model and write the checkpoint."""
    from twinrun.model.export import export_merged

    def loading(base: object) -> None:
        click.echo(f"export: merging {run} into {base} ...", err=True)

    info = export_merged(run, output, model, overwrite, loading)
    click.echo(f"export: {output} (merged sha256 {info['merged_sha256']})")
