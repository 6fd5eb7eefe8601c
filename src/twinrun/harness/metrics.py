"""The pure half of the determinism harness: read each run's metrics, compare same-seed and
cross-seed runs, check diag files, and state the verdict (`judge`, `format_verdict`). Nothing here
runs a process."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from twinrun.diag.compare import CompareResult, Divergence, compare, divergence_line, jsonable
from twinrun.diag.recorded import RecordedDifference, format_difference, sidecars_differ_in

if TYPE_CHECKING:
    from twinrun.harness.plan import RunResult

from twinrun.core.errors import ConfigError, DataError
from twinrun.core.redact import redact_argv

DEFAULT_TOL = 1e-2
DEFAULT_SEEDS = (0, 1)
LOSS_KEY = "loss"
_IGNORED_NAMES = frozenset(
    {"wall", "wall_s", "time", "timestamp", "elapsed", "peak_memory_bytes", "peak_memory"}
)
_IGNORED_SUFFIXES = ("_s", "_ms", "_seconds", "_time", "_timestamp")


def is_ignored_metric(name: str) -> bool:
    """Wall-clock and machine measurements (never compared): `wall_s`, `*_s`, timestamps."""
    n = name.rsplit("/", 1)[-1].lower()
    return n in _IGNORED_NAMES or n.endswith(_IGNORED_SUFFIXES)


def _by_step(rows: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Rows keyed by their `step` (the row index when a row has none; a later row wins)."""
    out: dict[int, Mapping[str, Any]] = {}
    for i, row in enumerate(rows):
        step = row.get("step", i)
        out[step if isinstance(step, int) and not isinstance(step, bool) else i] = row
    return dict(sorted(out.items()))


def _comparable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "step" and not is_ignored_metric(k)}


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two JSON values (floats by their IEEE-754 bits; NaN equals NaN)."""
    if isinstance(a, float) or isinstance(b, float):
        if not (_is_number(a) and _is_number(b)):
            return False
        fa, fb = float(a), float(b)
        if math.isnan(fa) and math.isnan(fb):
            return True
        return struct.pack("<d", fa) == struct.pack("<d", fb)
    return type(a) is type(b) and a == b


def _abs_diff(a: Any, b: Any) -> float:
    """|a-b| of two numbers: 0 when bitwise equal or both NaN; inf when only one is NaN or inf."""
    if _same_bits(a, b):
        return 0.0
    fa, fb = float(a), float(b)
    if math.isnan(fa) or math.isnan(fb) or math.isinf(fa) or math.isinf(fb):
        return 0.0 if fa == fb else math.inf
    return abs(fa - fb)


# ----------------------------------------------------------------------------- the three checks


@dataclass(frozen=True)
class Step0:
    """Bit-exactness of the first step. When it fails, `metric` names the first differing value
    (the loss first, then the row's own order) and `a`/`b` are the two values."""

    step: int | None
    bit_exact: bool
    loss: float | None
    metric: str | None = None
    a: Any = None
    b: Any = None


@dataclass(frozen=True)
class SameSeed:
    """Same-seed comparison: the max |a-b| over steps and comparable numeric metrics (where,
    and the two values), and bitwise agreement of every comparable value."""

    max_divergence: float
    metric: str | None
    step: int | None
    a: Any
    b: Any
    bit_exact: bool
    values_compared: int
    values_differing: int
    steps: int
    first_difference: tuple[int, str] | None  # (step, metric) of the first non-bit-exact value
    missing: list[str] = field(default_factory=list)  # rows / metrics only one run has


@dataclass(frozen=True)
class CrossSeed:
    """Max |a-c| of the loss over the steps both runs recorded; NaN when there is none."""

    divergence: float
    step: int | None
    a: float | None
    c: float | None
    steps: int
    metric: str = LOSS_KEY


@dataclass(frozen=True)
class DiagCheck:
    """The diag.jsonl comparison of the same-seed runs (None in a Verdict when neither wrote one).

    `digests_equal` is None when only one run has diag.jsonl. `first` is the first divergence
    (tolerance-based, or bitwise when `bitwise`), set only when the runs part."""

    present: str  # "both", "a" or "b"
    digests_equal: bool | None
    rows: int
    leaves: int
    first: Divergence | None = None
    bitwise: bool = False
    line: str | None = None
    advice: str | None = None
    rows_diverged: int = 0


def step0(rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]) -> Step0:
    """Is the first step of two same-seed runs bit-exact (every comparable metric)?"""
    sa, sb = _by_step(rows_a), _by_step(rows_b)
    if not sa or not sb:
        return Step0(None, False, None, "<row>", None, None)
    first = min(sa)
    ra = _comparable(sa[first])
    loss = ra.get(LOSS_KEY)
    loss = float(loss) if _is_number(loss) else None
    if first not in sb:
        return Step0(first, False, loss, "<row>", "row", "missing")
    rb = _comparable(sb[first])
    keys = list(ra) + [k for k in rb if k not in ra]
    keys.sort(key=lambda k: k != LOSS_KEY)  # stable: the loss first, then the row's order
    for k in keys:
        if k not in ra or k not in rb:
            return Step0(first, False, loss, k, ra.get(k, "missing"), rb.get(k, "missing"))
        if not _same_bits(ra[k], rb[k]):
            return Step0(first, False, loss, k, ra[k], rb[k])
    return Step0(first, True, loss)


def compare_same_seed(
    rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]
) -> SameSeed:
    """Max |a-b| over steps and comparable numeric metrics, and full bitwise agreement.

    A step or a metric only one run has diverges by inf; a non-numeric value (a string such as
    a sha256) counts only for bit-exactness."""
    sa, sb = _by_step(rows_a), _by_step(rows_b)
    best: tuple[float, str | None, int | None, Any, Any] = (0.0, None, None, None, None)
    compared = differing = 0
    first_diff: tuple[int, str] | None = None
    missing: list[str] = []

    def note(delta: float, metric: str, step: int, a: Any, b: Any) -> None:
        nonlocal best
        if delta > best[0]:
            best = (delta, metric, step, a, b)

    for step in sorted(set(sa) | set(sb)):
        if step not in sa or step not in sb:
            who = "b" if step in sa else "a"
            missing.append(f"step {step} (not in run {who})")
            differing += 1
            first_diff = first_diff or (step, "<row>")
            note(math.inf, "<row>", step, "row" if who == "b" else "missing",
                 "missing" if who == "b" else "row")  # fmt: skip
            continue
        ra, rb = _comparable(sa[step]), _comparable(sb[step])
        for k in list(ra) + [k for k in rb if k not in ra]:
            compared += 1
            if k not in ra or k not in rb:
                missing.append(f"{k} at step {step} (not in run {'b' if k in ra else 'a'})")
                differing += 1
                first_diff = first_diff or (step, k)
                note(math.inf, k, step, ra.get(k, "missing"), rb.get(k, "missing"))
                continue
            va, vb = ra[k], rb[k]
            if _same_bits(va, vb):
                continue
            differing += 1
            first_diff = first_diff or (step, k)
            if _is_number(va) and _is_number(vb):
                note(_abs_diff(va, vb), k, step, va, vb)
    delta, metric, step_, a, b = best
    return SameSeed(
        max_divergence=delta,
        metric=metric,
        step=step_,
        a=a,
        b=b,
        bit_exact=differing == 0,
        values_compared=compared,
        values_differing=differing,
        steps=len(set(sa) | set(sb)),
        first_difference=first_diff,
        missing=missing,
    )


def cross_seed(
    rows_a: Sequence[Mapping[str, Any]], rows_c: Sequence[Mapping[str, Any]], key: str = LOSS_KEY
) -> CrossSeed:
    """Max |a-c| of `key` over the steps both runs recorded (NaN when no step has it in both)."""
    sa, sc = _by_step(rows_a), _by_step(rows_c)
    best: tuple[float, int | None, float | None, float | None] = (math.nan, None, None, None)
    n = 0
    for step in sorted(set(sa) & set(sc)):
        va, vc = sa[step].get(key), sc[step].get(key)
        if not (_is_number(va) and _is_number(vc)):
            continue
        n += 1
        d = _abs_diff(va, vc)
        if math.isnan(best[0]) or d > best[0]:
            best = (d, step, float(va), float(vc))
    return CrossSeed(best[0], best[1], best[2], best[3], n, key)


def check_diag(
    dir_a: str | os.PathLike[str],
    dir_b: str | os.PathLike[str],
    metrics_bit_exact: bool = True,
    recorded: Sequence[RecordedDifference] = (),
) -> DiagCheck | None:
    """Compare the same-seed runs' diag.jsonl (None when neither has one).

    Digests are compared bitwise; when the runs part (digests differ or the metrics are not
    bit-exact) the first divergence comes from the tolerance comparison at diff's default
    tolerances, or from the bitwise one when the tolerance comparison finds none. The advice
    names first the `recorded` differences of the runs' sidecars that bear on it. A DataError
    from an unreadable diag file propagates (exit 2)."""
    fa, fb = Path(dir_a) / "diag.jsonl", Path(dir_b) / "diag.jsonl"
    has_a, has_b = fa.is_file(), fb.is_file()
    if not has_a and not has_b:
        return None
    if not (has_a and has_b):
        return DiagCheck("a" if has_a else "b", None, 0, 0)
    bitwise = compare(fa, fb, bitwise=True)
    # rows of two diag formats: their digests were not compared, so no bytes are known equal
    digests_equal = bitwise.deterministic and not bitwise.digests_skipped
    if digests_equal and metrics_bit_exact:
        return DiagCheck("both", True, bitwise.rows_compared, len(bitwise.leaves))
    tol = compare(fa, fb)
    chosen: CompareResult | None = tol if tol.first is not None else None
    if chosen is None and bitwise.first is not None:
        chosen = bitwise
    if chosen is None or chosen.first is None:
        return DiagCheck("both", digests_equal, bitwise.rows_compared, len(bitwise.leaves))
    from twinrun.diag.advice import advice_for

    adv = advice_for(chosen.first.leaf)
    return DiagCheck(
        present="both",
        digests_equal=digests_equal,
        rows=bitwise.rows_compared,
        leaves=len(bitwise.leaves),
        first=chosen.first,
        bitwise=chosen.bitwise,
        line=divergence_line(chosen.first),
        advice=f"{adv.leaf}: {sidecars_differ_in(recorded, adv.one_line())}{adv.one_line()}",
        rows_diverged=chosen.rows_diverged,
    )


# ----------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    """What `twinrun check` found. `exit_code`: 0 when all three hold, 1 when one fails.

    `recorded`: what the same-seed runs' sidecars state differently (they should agree; it does
    not change the verdict); None when the runs wrote no twinrun.json."""

    tol: float
    seeds: tuple[int, int]
    step0: Step0
    same_seed: SameSeed
    cross_seed: CrossSeed
    diag: DiagCheck | None
    failures: list[str]
    runs: list[RunResult] = field(default_factory=list)
    recorded: list[RecordedDifference] | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def fully_bit_exact(self) -> bool:
        """Every comparable metric equal at every step, and diag digests equal when present."""
        if not self.same_seed.bit_exact:
            return False
        return self.diag is None or self.diag.digests_equal is True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite floats as "NaN"/"Infinity" strings)."""
        d: dict[str, Any] = {
            "passed": self.passed,
            "exit_code": self.exit_code,
            "tol": self.tol,
            "seeds": list(self.seeds),
            "fully_bit_exact": self.fully_bit_exact,
            "step0": asdict(self.step0),
            "same_seed": asdict(self.same_seed),
            "cross_seed": asdict(self.cross_seed),
            "diag": None if self.diag is None else asdict(self.diag),
            "failures": list(self.failures),
            "recorded_differences": None
            if self.recorded is None
            else [r.to_dict() for r in self.recorded],
            "runs": [
                {
                    "label": r.run.label,
                    "seed": r.run.seed,
                    "out": str(r.run.out),
                    "argv": redact_argv(r.run.argv),
                    "returncode": r.returncode,
                    "wall_s": r.wall_s,
                }
                for r in self.runs
            ],
        }
        return jsonable(d)


def judge(
    rows_a: Sequence[Mapping[str, Any]],
    rows_b: Sequence[Mapping[str, Any]],
    rows_c: Sequence[Mapping[str, Any]],
    tol: float = DEFAULT_TOL,
    seeds: tuple[int, int] = DEFAULT_SEEDS,
    diag: DiagCheck | None = None,
) -> Verdict:
    """The verdict on three runs' metrics rows (a, b at one seed; c at another).

    DataError (exit 2) when a run has no rows; ConfigError for a negative or NaN tolerance."""
    if not (tol >= 0) or math.isinf(tol):
        raise ConfigError(f"--tol {tol!r} must be a finite non-negative number")
    for name, rows in (("a", rows_a), ("b", rows_b), ("c", rows_c)):
        if not rows:
            raise DataError(f"run {name} wrote no metrics rows", "did the command train at all?")
    s0 = step0(rows_a, rows_b)
    same = compare_same_seed(rows_a, rows_b)
    cross = cross_seed(rows_a, rows_c)
    failures: list[str] = []
    if not s0.bit_exact:
        failures.append(f"step-{s0.step if s0.step is not None else 0} is not bit-exact")
    if not same.max_divergence <= tol:
        failures.append(f"same-seed divergence {_fmt(same.max_divergence)} exceeds tol {tol:g}")
    if math.isnan(cross.divergence):
        failures.append(f"no {cross.metric!r} metric at a step both seeds recorded")
    elif not cross.divergence > tol:
        failures.append(
            f"cross-seed divergence {_fmt(cross.divergence)} does not exceed tol {tol:g} "
            f"(the seed changes nothing)"
        )
    return Verdict(tol, seeds, s0, same, cross, diag, failures)


# ----------------------------------------------------------------------------- the whole check


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.3e}"


def _val(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def _recorded_lines(v: Verdict) -> list[str]:
    """The same-seed runs' sidecars: each difference (they should have none), or — when the runs
    parted — that they agree, which rules out every recorded setting, input and environment."""
    if v.recorded is None:
        return []
    if v.recorded:
        n = len(v.recorded)
        out = [f"sidecars: the same-seed runs' twinrun.json differ in {n} recorded "
               f"{'fact' if n == 1 else 'facts'} (the command should make them agree)"]  # fmt: skip
        return out + [f"  {format_difference(d, ('run_a', 'run_b'))}" for d in v.recorded]
    if v.fully_bit_exact:
        return []
    return ["sidecars: the same-seed runs' twinrun.json agree (no setting, input or environment "
            "difference recorded)"]  # fmt: skip


def _step0_line(v: Verdict) -> str:
    """Whether step 0 is bit-exact: its loss (or every metric) equal, else the first metric
    that differs and its two values."""
    s0 = v.step0
    label = f"step-{s0.step if s0.step is not None else 0} bit-exact"
    if s0.bit_exact:
        what = f"loss {s0.loss!r}" if s0.loss is not None else "every metric equal"
        return f"{label}: yes ({what})"
    if s0.metric == LOSS_KEY:
        return f"{label}: NO ({_val(s0.a)} vs {_val(s0.b)})"
    return f"{label}: NO ({s0.metric} {_val(s0.a)} vs {_val(s0.b)})"


def _same_seed_line(v: Verdict) -> str:
    """The same-seed runs' largest divergence against the tolerance, where it is, and how far
    from bit-exact the runs are."""
    s = v.same_seed
    rel = "<=" if s.max_divergence <= v.tol else ">"
    line = f"same-seed max divergence: {_fmt(s.max_divergence)} ({rel} tol {v.tol:g})"
    if s.metric is not None:
        line += f" at {s.metric}, step {s.step} ({_val(s.a)} vs {_val(s.b)})"
    if v.fully_bit_exact:
        extra = f", diag digests at {v.diag.rows} steps" if v.diag is not None else ""
        return line + (
            f" — fully bit-exact: {s.values_compared} metric values over {s.steps} steps{extra}"
        )
    if s.bit_exact:
        if v.diag is not None and v.diag.digests_equal is None:
            return line + f" — metrics bit-exact, but only run {v.diag.present} wrote diag.jsonl"
        return line + " — metrics bit-exact, diag digests differ"
    fs, fm = s.first_difference or (None, None)
    return line + (
        f" — not bit-exact: {s.values_differing} of {s.values_compared} values differ, "
        f"first: {fm} at step {fs}"
    )


def _cross_seed_line(v: Verdict) -> str:
    """How far the two seeds' runs part, against the tolerance."""
    c = v.cross_seed
    if math.isnan(c.divergence):
        return f"cross-seed divergence: n/a (no {c.metric!r} at a common step)"
    rel = ">" if c.divergence > v.tol else "<="
    tail = "distinct trajectory" if rel == ">" else "the seed changes nothing"
    return (
        f"cross-seed divergence: {_fmt(c.divergence)} ({rel} tol {v.tol:g}: {tail}; "
        f"{c.metric} at step {c.step}: {c.a!r} vs {c.c!r})"
    )


def _diag_lines(v: Verdict) -> list[str]:
    """The diag.jsonl comparison: the first divergence and its advice, or that only one run
    wrote diag.jsonl; nothing without one."""
    d = v.diag
    if d is not None and d.line is not None:
        how = "bitwise digests" if d.bitwise else "diff default tolerances"
        out = [d.line, f"  ({how}; {d.rows_diverged} of {d.rows} diag rows diverged)"]
        if d.advice:
            out.append(f"  advice: {d.advice}")
        return out
    if d is not None and d.digests_equal is None:
        return [f"diag: only run {d.present} wrote diag.jsonl; nothing to localise"]
    return []


def _verdict_line(v: Verdict) -> str:
    """PASS and how (bit-exact or within the tolerance), or FAIL and every failed check."""
    seeds = f"seeds {v.seeds[0]},{v.seeds[1]}"
    if v.passed:
        kind = "bit-exact" if v.fully_bit_exact else f"reproducible within tol {v.tol:g}"
        return f"verdict: PASS ({seeds}) — {kind}; step-0 bit-exact; seeds distinct"
    return f"verdict: FAIL ({seeds}) — {'; '.join(v.failures)}"


def format_verdict(v: Verdict) -> list[str]:
    """The report, posttrainllm-style, one line per check, then the verdict line."""
    out = [_step0_line(v), _same_seed_line(v)]
    out += [f"  only one run has {m}" for m in v.same_seed.missing[:5]]
    out += _recorded_lines(v)
    out.append(_cross_seed_line(v))
    out += _diag_lines(v)
    out.append(_verdict_line(v))
    return out
