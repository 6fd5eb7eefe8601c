"""`twinrun evidence SOURCE REPLAY... [--require A|B] [--json] [--repeat N CONFIG]`.

Exit 0 when the required gates pass, 1 when one does not, 2 when an input is missing or
unreadable (or a repeated replay fails)."""

from __future__ import annotations

import click


@click.command("evidence")
@click.argument("source", type=click.Path(file_okay=False))
@click.argument("replays", nargs=-1, type=click.Path(file_okay=False))
@click.option(
    "--require",
    "require",
    multiple=True,
    type=click.Choice(["A", "B"]),
    help="Gate that must pass (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--repeat",
    nargs=2,
    type=(int, click.Path(dir_okay=False)),
    default=None,
    help="N CONFIG: first run N fresh replays of CONFIG (each in its own process; N <= 100).",
)
def evidence(
    source: str,
    replays: tuple[str, ...],
    require: tuple[str, ...],
    as_json: bool,
    repeat: tuple[int, str] | None,
) -> int:
    """Gates A and B, update cosine / relative delta L2, and timing spread."""
    import json
    from pathlib import Path

    from twinrun.replay.evidence import evaluate, render
    from twinrun.replay.repeat import repeat_replays

    paths = [Path(p) for p in replays]
    if repeat is not None:
        paths += repeat_replays(Path(repeat[1]), repeat[0])
    if not paths:
        raise click.UsageError("give at least one REPLAY directory or --repeat N CONFIG")
    report = evaluate(Path(source), paths, sorted(set(require)))
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    return int(report["exit"])
