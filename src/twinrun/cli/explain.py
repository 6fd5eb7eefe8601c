"""`twinrun explain CONFIG.toml [--json]`: every check, no model built. Exit 0 when all pass,
1 when one fails, 2 when the config itself cannot be read."""

from __future__ import annotations

import click


@click.command("explain")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def explain(config: str, as_json: bool) -> int:
    """Verify pins, payload, adapter and config contract of CONFIG.toml without a model."""
    import json

    from twinrun.replay.explain import explain_config, render

    report = explain_config(config)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    return 0 if report["ok"] else 1
