"""`twinrun diff RUN_A RUN_B`: the first divergence between two runs.

When both runs have a step trace (`--trace-step`, trace.jsonl beside diag.jsonl) at the first
divergent step, a `FIRST_MODULE:` line names the first module, in execution order, where the
traces part, forward or backward, with its own advice:

    FIRST_MODULE: step=1 backward lm_head rel=7.5e-01 call=0 entry=backward run_A=... run_B=...

When both runs have a sidecar (twinrun.json beside diag.jsonl) and the sidecars state a setting,
input or environment fact differently (`twinrun.diag.recorded`), a block comes first — those are
facts, not guesses — and an advice line bearing on one of them names it first:

    RECORDED_DIFFERENCES: 2
      train.threads: run_A=1 run_B=2 (setting)
      determinism.threads: run_A=1 run_B=2 (environment)

Exit status: 0 deterministic, 1 divergence, 2 inputs missing or unreadable (a DataError names
the file and line). Imports neither torch nor numpy (matplotlib only with --report).
"""

from __future__ import annotations

import json
import math
from typing import Any

import click

from twinrun.cli.options import FiniteFloat
from twinrun.diag.advice import Advice, advice_for, trace_advice
from twinrun.diag.compare import (
    CompareResult,
    Divergence,
    compare,
    divergence_line,
    format_number,
)
from twinrun.diag.recorded import (
    RecordedDifference,
    bearing_on,
    format_difference,
    recorded_between,
    sidecars_differ_in,
)
from twinrun.diag.recorder import STANDARD_LEAVES, TRAINER_ROW_LEAVES
from twinrun.diag.rows import DIAG_FORMATS
from twinrun.diag.trace import TraceDivergence

TOLERANCE = FiniteFloat(low=0)  # finite and >= 0: nan would make every comparison pass


def _rel(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3e}"


def _module_line(m: TraceDivergence) -> str:
    line = f"FIRST_MODULE: step={m.step} {m.direction} {m.module} rel={_rel(m.rel)} call={m.call}"
    line += f" entry={m.kind}"
    if m.structural:
        line += f" structure: run_A has {m.kind} {m.module} call {m.call}, run_B has {m.other}"
    else:
        line += f" run_A={format_number(m.a)} run_B={format_number(m.b)}"
    if m.within_tol:
        line += " within_tol"
    if m.phase != "train":
        line += f" phase={m.phase}"
    return line


def _recorded_block(recorded: list[RecordedDifference] | None) -> list[str]:
    """RECORDED_DIFFERENCES and one line each; nothing when the sidecars agree or one is absent."""
    if not recorded:
        return []
    return [f"RECORDED_DIFFERENCES: {len(recorded)}"] + [
        f"  {format_difference(d)}" for d in recorded
    ]


def _text(r: CompareResult, recorded: list[RecordedDifference] | None) -> list[str]:
    """The text report: the recorded differences and any one-sided leaves, then the verdict."""
    mode = "bitwise (digests)" if r.bitwise else f"rel_tol={r.rel_tol:g} abs_tol={r.abs_tol:g}"
    head = _recorded_block(recorded)
    if r.one_sided:
        shown = ", ".join(f"{leaf} ({side} only)" for leaf, side in r.one_sided.items())
        head.append(f"COMMON_LEAVES: left out, recorded by one run only: {shown}")
    if r.digests_skipped and r.formats is not None:
        a, b = r.formats
        head.append(
            f"DIGESTS: not compared at {r.digests_skipped} of {r.rows_compared} rows: run A's "
            f"rows are {a} ({DIAG_FORMATS[a]}), run B's {b} ({DIAG_FORMATS[b]}); their "
            "checksums are compared" + (" exactly" if r.bitwise else "")
        )
    if r.first is None:
        return head + _deterministic_lines(r, mode)
    return head + _divergence_lines(r, r.first, recorded, mode)


def _deterministic_lines(r: CompareResult, mode: str) -> list[str]:
    """DETERMINISTIC and its counts, and a note when the bytes differ within tolerance."""
    out = [
        f"DETERMINISTIC: {r.rows_compared} rows, {len(r.leaves)} leaves compared "
        f"({r.values_compared} values, {mode})",
        f"0 of {r.rows_compared} rows diverged",
    ]
    if r.bytes_differ:
        out.append(
            f"  within tolerance, but the bytes differ: {r.bytes_differ} of "
            f"{r.rows_compared} rows hold a leaf whose digest differs (--bitwise names the "
            "first)"
        )
    return out


def _divergence_lines(
    r: CompareResult, f: Divergence, recorded: list[RecordedDifference] | None, mode: str
) -> list[str]:
    """The first divergence: its line and kind, the leaves diverging with it, the first module
    (or why there is none), the advice, the counts and the per-step table."""
    out = [divergence_line(f), *_kind_lines(f), *_co_diverging_lines(r, f, mode)]
    if r.first_module is not None:
        out.append(_module_line(r.first_module))
        tadv = trace_advice(r.first_module)
        out.append(f"  trace advice: {_first(recorded, tadv)}{tadv.one_line()}")
    elif r.trace_note is not None:
        out.append(f"trace: {r.trace_note}")
    adv = advice_for(f.leaf)
    out.append(f"advice: {adv.leaf}: {_first(recorded, adv)}{adv.one_line()}")
    out.append(f"{r.rows_diverged} of {r.rows_compared} rows diverged")
    out += _table(r)
    return out


def _kind_lines(f: Divergence) -> list[str]:
    """What a divergence that is not a value difference is: a missing row or leaf, or digests."""
    if f.kind == "missing_row":
        return [f"  run {f.missing_in} has no row for phase={f.phase} step={f.step}"]
    if f.kind == "missing_leaf":
        line = f"  run {f.missing_in} has no leaf {f.leaf} at this step"
        if f.leaf in STANDARD_LEAVES and f.leaf not in TRAINER_ROW_LEAVES:
            return [
                line,
                f"  a Trainer run's DiagCallback never records {f.leaf}: if run "
                f"{f.missing_in} is one, it records fewer leaves, not other values — "
                "--common-leaves compares the leaves both runs record",
            ]
        return [line]
    if f.kind == "digest":
        return ["  digests differ (the bytes differ; checksums may agree)"]
    return []


def _co_diverging_lines(r: CompareResult, f: Divergence, mode: str) -> list[str]:
    """The leaves diverging at the first divergent step, largest relative difference first."""
    if not r.co_diverging:
        return []
    out = [f"  diverging at this step, largest relative difference first ({mode}):"]
    width = max(len(d.leaf) for d in r.co_diverging)
    for d in r.co_diverging:
        note = "  <- first" if d.leaf == f.leaf else ""
        kind = "" if d.kind == "value" else f"  ({d.kind})"
        out.append(f"    {d.leaf:<{width}}  rel={_rel(d.rel)}{kind}{note}")
    return out


TABLE_ROWS = 20


def _table(r: CompareResult) -> list[str]:
    """The per-step table of diverging leaves (train and eval rows), the first TABLE_ROWS."""
    if not r.table:
        return []
    out = ["diverging leaves per step:", f"  {'phase':<6} {'step':>6}  leaves"]
    for row in r.table[:TABLE_ROWS]:
        out.append(f"  {row.phase:<6} {row.step:>6}  {', '.join(row.leaves)}")
    total = len(r.table) if r.table_rows is None else r.table_rows
    if total > TABLE_ROWS:
        out.append(f"  ... {total - TABLE_ROWS} more rows (--json lists them all)")
    return out


def _first(recorded: list[RecordedDifference] | None, adv: Advice) -> str:
    """What an advice line says first: the recorded differences that bear on it, if any."""
    return sidecars_differ_in(recorded or [], adv.one_line())


def _bearing(recorded: list[RecordedDifference] | None, adv: Advice) -> dict[str, Any]:
    """The JSON advice's `recorded`: the keys bearing on it (only when both sidecars were read)."""
    if recorded is None:
        return {}
    return {"recorded": [d.key for d in bearing_on(recorded, adv.one_line())]}


def _json(r: CompareResult, report: str | None, recorded: list[RecordedDifference] | None) -> str:
    d = r.to_dict()
    adv = advice_for(r.first.leaf) if r.first is not None else None
    d["advice"] = (
        None
        if adv is None
        else {"leaf": adv.leaf, "cause": adv.cause, "fix": adv.fix} | _bearing(recorded, adv)
    )
    if r.first_module is not None:
        tadv = trace_advice(r.first_module)
        d["first_module_line"] = _module_line(r.first_module)
        d["trace_advice"] = {"module": tadv.leaf, "cause": tadv.cause, "fix": tadv.fix}
        d["trace_advice"] |= _bearing(recorded, tadv)
    else:
        d["trace_advice"] = None
    d["leaves_compared"] = len(r.leaves)
    d["exit_code"] = 0 if r.deterministic else 1
    if report is not None:
        d["report"] = report
    if recorded is not None:  # both runs have a sidecar
        d["recorded_differences"] = [x.to_dict() for x in recorded]
    return json.dumps(d, allow_nan=False)


@click.command(name="diff")
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@click.option("--rel-tol", type=TOLERANCE, default=1e-5, show_default=True, help="Relative tol.")
@click.option("--abs-tol", type=TOLERANCE, default=1e-7, show_default=True, help="Absolute tol.")
@click.option("--bitwise", is_flag=True, help="Compare digests (bitwise) instead of checksums.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option(
    "--common-leaves", is_flag=True,
    help="Compare only the leaves both runs record (e.g. a twinrun run and a Trainer run).",
)  # fmt: skip
@click.option(
    "--report", type=click.Path(dir_okay=False), default=None,
    help="Write a steps x leaves heatmap of relative differences to this PNG.",
)  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace a --report PNG an earlier diff wrote.")
def diff(
    run_a: str,
    run_b: str,
    rel_tol: float,
    abs_tol: float,
    bitwise: bool,
    as_json: bool,
    common_leaves: bool,
    report: str | None,
    overwrite: bool,
) -> int:
    """First divergence between two runs.

    RUN_A and RUN_B are diag.jsonl files or run directories written with --diag. Rows are
    matched by (phase, step); the first divergence is the earliest diverging leaf, in dataflow
    order, of the first diverging row. When both runs have a twinrun.json sidecar, the settings,
    inputs and environment they record differently are printed first. Exit status:
    0 deterministic, 1 divergence, 2 missing or unreadable input.
    """
    if report is not None:
        from twinrun.diag.report import claim_report

        claim_report(report, overwrite, (run_a, run_b))
    result = compare(
        run_a,
        run_b,
        rel_tol=rel_tol,
        abs_tol=abs_tol,
        bitwise=bitwise,
        keep_matrix=report is not None,  # the heatmap
        keep_table=True,  # the per-step table: all of it in JSON, its first rows in text
        table_limit=None if as_json else TABLE_ROWS,
        common_leaves=common_leaves,
    )
    if report is not None:
        from twinrun.diag.report import write_report

        write_report(result, report)
    recorded = recorded_between(run_a, run_b)
    if as_json:
        click.echo(_json(result, report, recorded))
    else:
        for line in _text(result, recorded):
            click.echo(line)
        if report is not None:
            click.echo(f"report: {report}")
    return 0 if result.deterministic else 1
