"""`twinrun golden write DIR` / `twinrun golden check DIR` / `twinrun golden trace DIR`: the golden
suite's bytes and numbers for this platform, and the op trace of its first SFT step. check and
trace exit 0 when everything is equal, 1 when something moved (the first is named), 2 when DIR
has no file for this platform."""

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


@golden.command("trace")
@click.argument("folder", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
@click.option("--write", "write_file", is_flag=True, help="Write DIR/optrace-<platform>.json.")
@click.option("--overwrite", is_flag=True, help="With --write: replace the file.")
def trace(folder: str, device: str, write_file: bool, overwrite: bool) -> int:
    """Compare every op of the suite's first SFT step with DIR's trace (or --write it): a
    mismatch names the first op that moved and the line that called it."""
    from twinrun.golden.traces import check_trace, write_trace

    if write_file:
        click.echo(f"golden: wrote {write_trace(folder, device, overwrite)}")
        return 0
    path, doc, moved, count = check_trace(folder, device)
    if moved is None:
        click.echo(f"golden trace: PASS — {count} ops equal {path}")
        return 0
    from twinrun.golden.files import machine_line

    click.echo(f"golden trace: FAIL — {moved.describe()}")
    click.echo(f"  {machine_line(doc.get('written_on'))}")
    click.echo(f"  {path}")
    return 1
