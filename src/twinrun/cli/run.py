"""`twinrun run CONFIG.toml`: run a TOML config (sft, dpo, reward, grpo, optimizer_replay)."""

from __future__ import annotations

import click


@click.command("run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--output", default=None, help="Use this run directory instead of [logging] dir.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def run(config: str, output: str | None, quiet: bool) -> None:
    """Run CONFIG.toml ([training] trainer = sft | dpo | reward | grpo | optimizer_replay)."""
    from twinrun.cli.tune import print_defaults_table
    from twinrun.dispatch.toml_runs import run_toml

    record = run_toml(
        config, output, quiet, loaded=lambda valid: print_defaults_table(valid, "toml")
    )
    if quiet or not record:  # no record: a data-parallel process other than rank 0
        return
    m = record["metrics"]
    if "replay" in record:
        r = record["replay"]
        click.echo(
            f"optimizer_replay: {record['train']['objective']} step {r['step']}, loss "
            f"{m['final_loss']:.6f}, final adapter sha256 {record['adapter']['sha256']}"
        )
    else:
        click.echo(
            f"{record['train']['objective']}: {m['steps']} steps, final loss "
            f"{m['final_loss']:.6f}, adapter sha256 {record['adapter']['sha256']}"
        )
