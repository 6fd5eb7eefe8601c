"""`twinrun golden write DIR` / `twinrun golden check DIR`: the golden suite's bytes and numbers
for this platform. check exits 0 when every item is equal, 1 when one moved (the first is
named), 2 when DIR has no file for this platform."""

from __future__ import annotations

import click


@click.group()
def golden() -> None:
    """Golden artifacts: a fixed suite's bytes and numbers, per platform."""


@golden.command("write")
@click.argument("folder", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
@click.option("--overwrite", is_flag=True, help="Replace this platform's golden file.")
def write(folder: str, device: str, overwrite: bool) -> None:
    """Compute the suite and write DIR/golden-<platform>.json."""
    from twinrun.golden.files import write_golden

    path = write_golden(folder, device, overwrite)
    click.echo(f"golden: wrote {path}")


@golden.command("check")
@click.argument("folder", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
def check(folder: str, device: str) -> int:
    """Compute the suite and compare it with DIR's file for this platform."""
    from twinrun.golden.files import check_golden

    result = check_golden(folder, device)
    for line in result.lines():
        click.echo(line)
    return 0 if result.ok else 1
