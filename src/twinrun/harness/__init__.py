"""The determinism harness behind `twinrun check` (docs/determinism.md).

A training command containing the placeholders `{seed}` and `{out}` is run three times as a real
subprocess: twice at seed S (runs "a" and "b") and once at seed T (run "c"), each writing into
its own output directory. Each run's `metrics.jsonl` (and `diag.jsonl`, when present) is then
read and three things are judged:

1. **step-0 bit-exact** — at the first step every comparable metric of a and b has the same bits;
2. **same-seed max divergence** — max over steps and comparable numeric metrics of |a-b| is at
   most the tolerance (and whether the runs are *fully* bit-exact: every comparable value equal,
   diag digests equal where both runs wrote them);
3. **cross-seed divergence** — max over common steps of |a-c| of the loss *exceeds* the
   tolerance: a seed that changes nothing is a bug.

Wall-clock fields (`wall_s`, any name ending in `_s`, timestamps, peak memory) are never
compared. When both same-seed runs wrote diag.jsonl and they part, the first divergence comes
from `twinrun.diag.compare` (default tolerances; bitwise digests when the tolerance comparison
finds none). When the runs wrote sidecars (twinrun.json), the report names any setting, input or
environment fact the same-seed runs' sidecars state differently (`twinrun.diag.recorded`; they
should agree), and says they agree when the runs parted. Exit codes: 0 all hold, 1 one fails,
2 a run fails or writes no metrics.

This module never imports the CLI (nor torch): `run_check` is the whole harness for a library
user; `judge` is the pure verdict on rows already read.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from twinrun.core.errors import ConfigError, DataError, OutputError, TwinrunError
from twinrun.core.owned import Layout
from twinrun.core.portable import user_environment
from twinrun.diag.compare import divergence_line
from twinrun.diag.metrics_file import read_metrics
from twinrun.diag.recorded import recorded_between
from twinrun.harness.metrics import (
    DEFAULT_SEEDS,
    DEFAULT_TOL,
    CrossSeed,
    DiagCheck,
    SameSeed,
    Step0,
    Verdict,
    check_diag,
    compare_same_seed,
    cross_seed,
    format_verdict,
    is_ignored_metric,
    judge,
    step0,
)
from twinrun.harness.plan import PlannedRun, RunResult

__all__ = [
    "DEFAULT_SEEDS",
    "DEFAULT_TOL",
    "PLACEHOLDERS",
    "CrossSeed",
    "DiagCheck",
    "PlannedRun",
    "RunFailed",
    "RunResult",
    "SameSeed",
    "Step0",
    "Verdict",
    "check_diag",
    "compare_same_seed",
    "cross_seed",
    "divergence_line",
    "execute",
    "format_verdict",
    "is_ignored_metric",
    "judge",
    "parse_seeds",
    "plan_runs",
    "read_metrics",
    "run_check",
    "step0",
    "substitute",
    "validate_command",
]

PLACEHOLDERS = ("{seed}", "{out}")
TAIL_LINES = 20

# Names never compared: they measure the machine, not the run.


class RunFailed(TwinrunError):
    """A planned run exited non-zero, timed out or could not start (exit code 2).

    `stderr_tail` holds the last lines the command wrote to stderr (stdout's when stderr was
    empty), for the CLI to show."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, tail: Sequence[str] = ()) -> None:
        from twinrun.core.redact import redact_string

        super().__init__(redact_string(message), hint)
        self.stderr_tail = [redact_string(line) for line in tail]


# ----------------------------------------------------------------------------- the run plan


def parse_seeds(text: str) -> tuple[int, int]:
    """Parse "S,T" into (S, T): two distinct non-negative integers below 2**63."""
    parts = [p.strip() for p in text.split(",")]
    hint = "give two distinct non-negative integers, e.g. --seeds 0,1"
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"--seeds {text!r} is not S,T", hint)
    s, t = int(parts[0]), int(parts[1])
    if s >= 2**63 or t >= 2**63:
        raise ConfigError(f"--seeds {text!r}: a seed must be below 2**63", hint)
    if s == t:
        raise ConfigError(f"--seeds {text!r}: the two seeds are equal", hint)
    return s, t


def validate_command(cmd: Sequence[str]) -> None:
    """ConfigError unless `cmd` is non-empty and contains both placeholders (anywhere in an
    argument, e.g. `--output={out}`)."""
    hint = "e.g. twinrun check -- twinrun tune sft ... --seed {seed} --output {out}"
    if not cmd:
        raise ConfigError("no command to check", hint)
    missing = [p for p in PLACEHOLDERS if not any(p in arg for arg in cmd)]
    if missing:
        raise ConfigError(f"the command has no {' or '.join(missing)} placeholder", hint)


def substitute(cmd: Sequence[str], seed: int, out: Path) -> tuple[str, ...]:
    """The argv with every `{seed}` and `{out}` replaced (other braces are left alone)."""
    return tuple(a.replace("{seed}", str(seed)).replace("{out}", str(out)) for a in cmd)


def plan_runs(cmd: Sequence[str], seeds: tuple[int, int], root: Path) -> list[PlannedRun]:
    """Three runs under `root`: seed-S-a, seed-S-b (same seed) and seed-T."""
    validate_command(cmd)
    s, t = seeds
    if s == t:
        raise ConfigError(f"seeds {s},{t} are equal", "the cross-seed run needs another seed")
    runs = []
    for label, seed in ((f"seed-{s}-a", s), (f"seed-{s}-b", s), (f"seed-{t}", t)):
        out = root / label
        runs.append(PlannedRun(label, seed, out, substitute(cmd, seed, out)))
    return runs


def kept_layout(run: Layout) -> Layout:
    """What `run_check(keep=DIR)` leaves in DIR (each run's own files as `run` declares them):
    the runs of `plan_runs`, their logs from `execute`, a killed run's lock (`core.lock`)."""
    label = r"seed-\d+(-[ab])?"
    return {
        label: run,
        "logs": {rf"{label}\.std(out|err)\.log": None},
        rf"\.{label}\.twinrun-lock": None,
    }


def _tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    from twinrun.core.redact import redact_string

    lines = text.rstrip("\n").splitlines()[-n:] if text.strip() else []
    return [redact_string(line) for line in lines]  # the CLI prints them


FULL_DISK = "No space left on device"
LOW_SPACE = 1 << 20  # a run that could not write a line of its log, with less free: a full disk
OWN_ERROR = "twinrun: error: "


def failure(run: PlannedRun, status: int, tail: list[str], log_dir: Path) -> RunFailed:
    """Why a run exited non-zero, in one line where one says it: a full disk under the run
    directories (its output says so, or it could not write a line of its log and under 1 MiB is
    free), the run's own one-line twinrun error, else the status with the last lines of its
    output."""
    import shutil

    said = f"{run.label} (seed {run.seed})"
    try:
        low = shutil.disk_usage(log_dir).free < LOW_SPACE
    except OSError:
        low = False
    if any(FULL_DISK in line for line in tail) or (low and not tail):
        return RunFailed(
            f"{said} stopped: no space left on the disk that holds {log_dir.parent} (the run "
            "cannot write its output or its log)",
            "free some space, or give --keep a directory on another disk",
        )
    if tail and tail[-1].startswith(OWN_ERROR):  # the run said what is wrong in one line
        return RunFailed(f"{said} exited with status {status}: {tail[-1][len(OWN_ERROR) :]}")
    return RunFailed(
        f"{said} exited with status {status}",
        "run the command on its own to see the whole output",
        tail,
    )


def execute(run: PlannedRun, log_dir: Path, timeout: float | None = None) -> RunResult:
    """Run one planned command (shell=False) in the user's environment (never the portable
    pin this process set: a native command runs the kernels it runs on its own), its stdout
    and stderr written to `log_dir/<label>.stdout.log` and `.stderr.log`. RunFailed when it
    cannot start, times out or exits non-zero."""
    log_dir.mkdir(parents=True, exist_ok=True)
    so, se = log_dir / f"{run.label}.stdout.log", log_dir / f"{run.label}.stderr.log"
    start = time.perf_counter()
    try:
        with open(so, "wb") as fo, open(se, "wb") as fe:
            proc = subprocess.run(
                list(run.argv), stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                timeout=timeout, check=False, env=user_environment(),
            )  # fmt: skip
    except FileNotFoundError as exc:
        raise RunFailed(
            f"{run.label}: cannot start {run.argv[0]!r} ({exc.strerror})",
            "check the command's first word is an executable on PATH",
        ) from exc
    except PermissionError as exc:
        raise RunFailed(f"{run.label}: cannot start {run.argv[0]!r} ({exc.strerror})") from exc
    except subprocess.TimeoutExpired as exc:
        raise RunFailed(
            f"{run.label} (seed {run.seed}) ran past the {timeout:g} s timeout",
            "raise --timeout or check the command on its own",
            _tail(se) or _tail(so),
        ) from exc
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise failure(run, proc.returncode, _tail(se) or _tail(so), log_dir)
    return RunResult(run, proc.returncode, wall, so, se)


# ----------------------------------------------------------------------------- reading metrics


def run_check(
    cmd: Sequence[str],
    *,
    seeds: tuple[int, int] = DEFAULT_SEEDS,
    tol: float = DEFAULT_TOL,
    keep: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> Verdict:
    """Run `cmd` three times and judge it. Without `keep`, everything is written under a
    temporary directory that is removed afterwards; with `keep`, the runs are
    `keep/seed-S-a`, `keep/seed-S-b`, `keep/seed-T` (logs beside them) and stay.

    Raises ConfigError for a bad command, seeds or tolerance; OutputError when a kept run
    directory already exists; RunFailed when a run fails; DataError when one writes no
    metrics (all exit 2)."""
    validate_command(cmd)
    if not (tol >= 0) or math.isinf(tol):
        raise ConfigError(f"--tol {tol!r} must be a finite non-negative number")
    if keep is not None:
        from twinrun.core.paths import output_path

        root = Path(keep)
        output_path(root, "--keep")  # a link, under a file, unwritable: before any run
        if root.exists() and not root.is_dir():
            raise OutputError(f"--keep {root}: exists and is not a directory")
        plan = plan_runs(cmd, seeds, root.resolve())
        taken = [str(r.out) for r in plan if r.out.exists()]
        if taken:
            raise OutputError(
                f"--keep {root}: {', '.join(taken)} already exists",
                "give a new --keep directory or remove the old runs",
            )
        root.mkdir(parents=True, exist_ok=True)
        return _run_plan(plan, root.resolve() / "logs", seeds, tol, timeout, progress)
    tmp = Path(tempfile.mkdtemp(prefix="twinrun-check-"))
    try:
        plan = plan_runs(cmd, seeds, tmp)
        return _run_plan(plan, tmp / "logs", seeds, tol, timeout, progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_plan(
    plan: list[PlannedRun],
    log_dir: Path,
    seeds: tuple[int, int],
    tol: float,
    timeout: float | None,
    progress: Callable[[str], None] | None,
) -> Verdict:
    say = progress or (lambda _msg: None)
    results: list[RunResult] = []
    rows: list[list[dict[str, Any]]] = []
    for i, run in enumerate(plan, 1):
        say(f"run {i}/{len(plan)}: {run.label} (seed {run.seed})")
        res = execute(run, log_dir, timeout)
        results.append(res)
        try:
            rows.append(read_metrics(run.out))
        except DataError as exc:
            raise DataError(f"{run.label} (seed {run.seed}): {exc.message}", exc.hint) from exc
        say(f"run {i}/{len(plan)}: {run.label} done in {res.wall_s:.1f} s, {len(rows[-1])} steps")
    same = compare_same_seed(rows[0], rows[1])
    recorded = recorded_between(plan[0].out, plan[1].out)
    diag = check_diag(plan[0].out, plan[1].out, same.bit_exact, recorded or ())
    verdict = judge(rows[0], rows[1], rows[2], tol, seeds, diag)
    verdict.runs = results
    verdict.recorded = recorded
    return verdict


# ----------------------------------------------------------------------------- text output
