"""`twinrun check [--tol 1e-2] [--seeds S,T] [--keep DIR] [--quick] -- CMD ...`: the determinism
harness.

A thin click command over `twinrun.harness.run_check`: CMD (with `{seed}` and `{out}`
placeholders) runs twice at seed S and once at seed T; the report says whether step 0 is
bit-exact, how far the same-seed runs drift, how far the seeds part, and where the same-seed runs
first diverge when they wrote diag.jsonl, and what the same-seed runs' sidecars (twinrun.json)
record differently — they should agree. Exit status: 0 all hold, 1 one fails, 2 a run fails
or writes no metrics (or the command is malformed). Imports neither torch nor numpy.
"""

from __future__ import annotations

import json

import click

from twinrun.cli.options import FiniteFloat
from twinrun.harness import (
    DEFAULT_TOL,
    RunFailed,
    Verdict,
    format_verdict,
    parse_seeds,
    run_check,
    validate_command,
)
from twinrun.harness.quick import QUICK_STEPS, quick_command


@click.command(
    name="check",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--tol", type=FiniteFloat(low=0), default=DEFAULT_TOL, show_default=True,
    help="Largest |a-b| of any metric allowed between the two same-seed runs; the cross-seed "
    "loss divergence must exceed it.",
)  # fmt: skip
@click.option(
    "--seeds", "seeds_text", default="0,1", show_default=True, metavar="S,T",
    help="The seed run twice, and the other seed.",
)  # fmt: skip
@click.option(
    "--keep", type=click.Path(file_okay=False), default=None, metavar="DIR",
    help="Write the runs to DIR/seed-S-a, DIR/seed-S-b, DIR/seed-T (and logs to DIR/logs) and "
    "keep them; default: a temporary directory, removed afterwards.",
)  # fmt: skip
@click.option(
    "--timeout", type=FiniteFloat(low=0, low_open=True), default=None, metavar="SECONDS",
    help="Fail (exit 2) a run that takes longer than this.",
)  # fmt: skip
@click.option(
    "--quick", is_flag=True,
    help="A fixed small budget for a fast answer: the first 3 steps of a twinrun tune command "
    "(--stop-after 3) and 8 eval examples (--eval-limit 8).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD...")
def check(
    tol: float,
    seeds_text: str,
    keep: str | None,
    timeout: float | None,
    quick: bool,
    as_json: bool,
    cmd: tuple[str, ...],
) -> int:
    """Determinism harness: run a command three times.

    CMD must contain {seed} and {out}; it runs (no shell) twice at seed S and once at seed T,
    each with its own output directory, and must write {out}/metrics.jsonl (diag.jsonl too with
    --diag, to localise a divergence). Checks: step 0 bit-exact; same-seed max divergence of every
    metric (wall-clock fields aside) <= --tol; cross-seed loss divergence > --tol. Exit status:
    0 all hold, 1 one fails, 2 a run fails or writes no metrics.

    \b
    Example:
      twinrun check -- twinrun tune sft --model runs/toy --examples ex.jsonl \\
        --output {out} --seed {seed} --epochs 1 --batch-size 4 ... --diag
    """
    validate_command(cmd)
    seeds = parse_seeds(seeds_text)
    if quick:
        cmd = quick_command(cmd)

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(f"check: {msg}", err=True)

    try:
        verdict = run_check(
            cmd, seeds=seeds, tol=tol, keep=keep, timeout=timeout, progress=progress
        )
    except RunFailed as exc:
        _report_failure(exc, keep=keep, as_json=as_json)
        return 2
    if as_json:
        quick_part = {"quick": {"steps": QUICK_STEPS}} if quick else {}
        click.echo(json.dumps(verdict.to_dict() | quick_part, allow_nan=False))
    else:
        _print_verdict(verdict, keep=keep, quick=quick)
    return verdict.exit_code


def _report_failure(exc: RunFailed, *, keep: str | None, as_json: bool) -> None:
    """Say that a run failed (exit 2): one JSON object, or an error line and the tail of the
    run's output on stderr."""
    if as_json:
        click.echo(json.dumps({"passed": False, "exit_code": 2, "error": exc.one_line(),
                               "stderr_tail": exc.stderr_tail}))  # fmt: skip
        return
    click.echo(f"twinrun: error: {exc.one_line()}", err=True)
    if not exc.stderr_tail:  # the line says it all (the run's own error, a full disk)
        return
    click.echo("  last lines of its output:", err=True)
    for line in exc.stderr_tail:
        click.echo(f"  | {line}", err=True)
    if keep is None:
        click.echo("  (rerun with --keep DIR to inspect the run directories)", err=True)


def _print_verdict(verdict: Verdict, *, keep: str | None, quick: bool) -> None:
    """Print the verdict as text: the quick budget's note, the report, where the runs were kept."""
    if quick:
        click.echo(f"quick: the first {QUICK_STEPS} steps of each run (--stop-after)")
    for line in format_verdict(verdict):
        click.echo(line)
    if keep is not None:
        click.echo(f"runs kept in {keep}")
