"""First divergence between two diag.jsonl files (`twinrun diff`; docs/diagnostics.md).

Rows are matched by (phase, step). Two checksums are equal when
`|a-b| <= abs_tol + rel_tol * max(|a|, |b|)`; NaN equals NaN only; with `bitwise=True` the
digests are compared instead. The first divergence is the first diverging row — rows ordered by
(phase, in order of first appearance in run A; step) — and in it the earliest diverging leaf in
the row's own (dataflow) order: the cause rather than the loudest symptom. A leaf or a row that
only one run has is a divergence.

Both files are streamed line by line in lockstep; only rows not yet matched are held (a small
dict when the files are aligned), so memory is flat in the number of rows unless `keep_matrix`
is asked for (the per-row relative differences the heatmap report draws). Byte-identical lines
are parsed once and not compared leaf by leaf.

Digests are compared only between rows of one format: a `twinrun.diag.v1` row's digests are
SHA256, a `twinrun.diag.v2` row's XXH3-128, so a pair of rows of two formats is compared on its
checksums alone (exactly, in bitwise mode) and counted in `digests_skipped`.

Reading: blank lines are skipped; unknown keys in a row are ignored; rows whose `format` is
another `twinrun.*` format (e.g. step traces) are skipped; checksums may be numbers or the
strings "NaN", "Infinity", "-Infinity". Anything else unreadable raises DataError naming the
file and line. This module imports neither torch nor numpy.

Step traces: when both runs have a `trace.jsonl` beside their diag.jsonl with a row for the
first divergence's (phase, step) (`--trace-step`), the two traces are compared entry by entry
in execution order (`twinrun.diag.trace.compare_traces`, same tolerances; bitwise mode compares
the trace checksums exactly) and `first_module` names the first module — forward or backward —
where they part. `trace_note` says why there is none when only one run has a trace there.
"""

from __future__ import annotations

import heapq
import math
import os
from dataclasses import asdict, dataclass, field
from itertools import compress, zip_longest
from operator import ne
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError
from twinrun.diag.rows import DiagRow, iter_lines, parse_row, resolve_diag_path
from twinrun.diag.tolerance import relative_difference, values_equal
from twinrun.diag.trace import TraceDivergence, compare_traces, read_trace, trace_path_for

__all__ = [
    "CompareResult",
    "DiffMatrix",
    "Divergence",
    "LeafDiff",
    "compare",
    "relative_difference",
    "resolve_diag_path",
    "values_equal",
]


@dataclass(frozen=True)
class LeafDiff:
    """One diverging leaf. `kind`: "value" (checksums differ beyond tolerance), "digest" (bitwise
    mode: digests differ), "missing" (the leaf is in one run only: a or b is None)."""

    leaf: str
    a: float | None
    b: float | None
    delta: float
    rel: float
    kind: str
    position: int  # index of the leaf in the row's dataflow order


@dataclass(frozen=True)
class Divergence:
    """The first divergence. `kind`: "value", "digest", "missing_leaf" or "missing_row" (then
    `leaf` is None and `missing_in` says which run, "A" or "B", lacks the row or leaf)."""

    phase: str
    step: int
    leaf: str | None
    a: float | None
    b: float | None
    delta: float
    rel: float
    kind: str
    missing_in: str | None = None


@dataclass
class DiffMatrix:
    """Relative differences per (phase, step) row × leaf, rows in comparison order. A cell is
    NaN where neither run has the leaf; `diverged` marks the cells that count as divergent."""

    rows: list[tuple[str, int]]
    leaves: list[str]
    rel: list[list[float]]
    diverged: list[list[bool]]


@dataclass(frozen=True)
class DivergingRow:
    """One row of the per-step table: a diverging (phase, step) and its diverging leaves, in
    dataflow order."""

    phase: str
    step: int
    leaves: list[str]


def diverging_table(matrix: DiffMatrix) -> list[DivergingRow]:
    """The rows of `matrix` where a leaf diverged (train and eval rows alike), in comparison
    order."""
    return [
        DivergingRow(phase, step, [leaf for leaf, d in zip(matrix.leaves, dv, strict=True) if d])
        for (phase, step), dv in zip(matrix.rows, matrix.diverged, strict=True)
        if any(dv)
    ]


@dataclass
class CompareResult:
    path_a: str
    path_b: str
    rel_tol: float
    abs_tol: float
    bitwise: bool
    deterministic: bool
    first: Divergence | None
    co_diverging: list[LeafDiff]  # every diverging leaf of the first row, largest rel first
    rows_compared: int  # distinct (phase, step) keys in either run
    rows_diverged: int
    leaves: list[str]  # every leaf seen, run A's order first
    values_compared: int
    matrix: DiffMatrix | None = field(default=None, repr=False)
    first_module: TraceDivergence | None = None  # from the step traces, when both have one
    trace_note: str | None = None  # why there is no first_module although a trace exists
    table: list[DivergingRow] | None = None  # per diverging (phase, step): its diverging leaves
    table_rows: int | None = None  # rows in the whole table (`table` may hold only the first)
    one_sided: dict[str, str] = field(default_factory=dict)  # common_leaves: leaf -> "A" | "B"
    bytes_differ: int = 0  # tolerance mode: rows whose digests differ (equal within tolerance)
    digests_skipped: int = 0  # paired rows of two formats: their digests were not compared
    formats: tuple[str, str] | None = None  # (A's, B's) row format where they differ

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite floats as "NaN"/"Infinity" strings; no matrix, no
        table_rows)."""
        d = asdict(self)
        d.pop("matrix")
        d.pop("table_rows")
        if not d["one_sided"]:
            d.pop("one_sided")  # only with common_leaves, when the runs' leaf sets differ
        if not d["bytes_differ"]:
            d.pop("bytes_differ")  # only when rows agree within tolerance but not bitwise
        if not d["digests_skipped"]:
            d.pop("digests_skipped")  # only when the runs' rows are of two formats
            d.pop("formats")
        return jsonable(d)


def jsonable(x: Any) -> Any:
    """A JSON-ready copy: non-finite floats as \"NaN\"/\"Infinity\"/\"-Infinity\" strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x


class _Table:
    """The per-step table of diverging leaves, collected without the matrix: every diverging
    row is counted; with a `limit`, only the rows that may still be among the first `limit`
    (in comparison order) are kept — the smallest steps of each phase, in a max-heap."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.total = 0
        self.kept: dict[str, list[tuple[int, list[str]]]] = {}  # phase -> (-step, leaves)

    def wants(self, phase: str, step: int) -> bool:
        if self.limit is None:
            return True
        heap = self.kept.get(phase)
        if not heap:
            return self.limit > 0
        return len(heap) < self.limit or step < -heap[0][0]

    def add(self, phase: str, step: int, leaves: list[str] | None) -> None:
        """Count a diverging row; keep its leaves (given when `wants` said so)."""
        self.total += 1
        if leaves is None or not self.wants(phase, step):
            return
        heap = self.kept.setdefault(phase, [])
        heapq.heappush(heap, (-step, leaves))
        if self.limit is not None and len(heap) > self.limit:
            heapq.heappop(heap)

    def rows(self, rank: Any) -> list[DivergingRow]:
        out = [
            DivergingRow(phase, -neg, leaves)
            for phase in sorted(self.kept, key=rank)
            for neg, leaves in sorted(self.kept[phase], reverse=True)
        ]
        return out if self.limit is None else out[: self.limit]


class _Comparer:
    """The streaming state: counters, the earliest divergence per phase, optional matrix."""

    def __init__(
        self, pa: Path, pb: Path, rel_tol: float, abs_tol: float, bitwise: bool,
        common: bool = False,
    ) -> None:  # fmt: skip
        self.pa, self.pb = pa, pb
        self.rel_tol, self.abs_tol, self.bitwise = rel_tol, abs_tol, bitwise
        self.common = common  # compare only the leaves both rows record
        self.one_sided: dict[str, str] = {}  # leaf -> "A" | "B": recorded by one run only
        self.bytes_differ = 0  # tolerance mode: paired rows whose digests are not all equal
        self.digests_skipped = 0  # paired rows of two formats (digests of two hashes)
        self.formats: tuple[str, str] | None = None  # the first such pair's (A, B) formats
        self.rows = 0
        self.diverged = 0
        self.values = 0
        self.leaves: dict[str, int] = {}  # every leaf seen -> its place, run A's order first
        self._last_leaves: tuple[str, ...] = ()
        self.phase_a: dict[str, int] = {}
        self.phase_b: dict[str, int] = {}
        self.best: dict[str, tuple[int, Divergence, list[LeafDiff]]] = {}
        self.matrix: list[tuple[str, int, dict[str, float], set[str]]] | None = None
        self.table: _Table | None = None

    def _see_leaves(self, names: list[str]) -> None:
        key = tuple(names)
        if key != self._last_leaves:
            self._last_leaves = key
            for n in names:
                self.leaves.setdefault(n, len(self.leaves))

    def _table_row(self, phase: str, step: int, leaves: list[str]) -> None:
        """A diverging row into the table: its leaves in the order of every leaf seen (the
        order of a leaf already seen never changes)."""
        if self.table is not None:
            self.table.add(phase, step, sorted(leaves, key=self.leaves.__getitem__))

    def identical(self, row: DiagRow) -> None:
        names = row.leaves()
        self._see_leaves(names)
        self.rows += 1
        self.values += len(names)
        if self.matrix is not None:
            self.matrix.append((row.phase, row.step, dict.fromkeys(names, 0.0), set()))

    def pair(self, ra: DiagRow, rb: DiagRow) -> None:
        """Compare two rows of the same (phase, step): count them, and record the row's
        divergence (its details when it may be the first, or for the matrix or the table)."""
        if ra.fmt != rb.fmt and ra.fmt is not None and rb.fmt is not None:
            ra, rb = self._without_digests(ra, rb)
        names = self._pair_names(ra, rb)
        self._see_leaves(names)
        self.rows += 1
        self.values += len(names)
        da_d, db_d = ra.digs, rb.digs
        if not self.bitwise and any(da_d.get(n) != db_d.get(n) for n in names if n in da_d):
            self.bytes_differ += 1
        found = self._row_diffs(ra, rb, names, self._wants_detail(ra))
        if found is None:  # diverged, and counted without details
            return
        diffs, rels = found
        if self.matrix is not None:
            full = {leaf: rels.get(leaf, 0.0) for leaf in names}
            self.matrix.append((ra.phase, ra.step, full, {d.leaf for d in diffs}))
        if diffs:
            f = diffs[0]
            kind = "missing_leaf" if f.kind == "missing" else f.kind
            missing = None if f.kind != "missing" else ("B" if f.b is None else "A")
            div = Divergence(ra.phase, ra.step, f.leaf, f.a, f.b, f.delta, f.rel, kind, missing)
            self._diverge(ra.phase, ra.step, div, diffs)
            self._table_row(ra.phase, ra.step, [d.leaf for d in diffs])

    def _without_digests(self, ra: DiagRow, rb: DiagRow) -> tuple[DiagRow, DiagRow]:
        """Two rows of two formats (two hashes) as rows without digests: counted, and compared
        on their checksums alone."""
        self.digests_skipped += 1
        if self.formats is None:
            self.formats = (str(ra.fmt), str(rb.fmt))
        return (
            DiagRow(ra.phase, ra.step, ra.checks, {}, ra.lineno, ra.text, ra.fmt),
            DiagRow(rb.phase, rb.step, rb.checks, {}, rb.lineno, rb.text, rb.fmt),
        )

    def _pair_names(self, ra: DiagRow, rb: DiagRow) -> list[str]:
        """The leaves two paired rows are compared on, run A's order first: with `common`,
        only those both record (noting the others in `one_sided`), else every leaf of either."""
        ca_d, cb_d, da_d, db_d = ra.checks, rb.checks, ra.digs, rb.digs
        if ca_d.keys() == cb_d.keys() == da_d.keys() == db_d.keys():
            return list(ca_d)  # the usual case: the same leaves everywhere
        if not self.common:
            return ra.leaves() + [k for k in rb.leaves() if k not in ca_d and k not in da_d]
        in_b = cb_d.keys() | db_d.keys()
        in_a = ca_d.keys() | da_d.keys()
        names = [k for k in ra.leaves() if k in in_b]
        for k in ra.leaves():
            if k not in in_b:
                self.one_sided.setdefault(k, "A")
        for k in rb.leaves():
            if k not in in_a:
                self.one_sided.setdefault(k, "B")
        return names

    def _wants_detail(self, ra: DiagRow) -> bool:
        """Whether a row's diverging leaves are needed: only for a row that may become the first
        divergence, or for the matrix or the table."""
        cur = self.best.get(ra.phase)
        table = self.table
        return (
            self.matrix is not None
            or cur is None
            or ra.step < cur[0]
            or (table is not None and table.wants(ra.phase, ra.step))
        )

    def _row_diffs(
        self, ra: DiagRow, rb: DiagRow, names: list[str], detail: bool
    ) -> tuple[list[LeafDiff], dict[str, float]] | None:
        """The row's diverging leaves, and the relative difference of each leaf not exactly
        equal; None (the row counted as diverged) at its first diverging leaf without `detail`."""
        diffs: list[LeafDiff] = []
        rels: dict[str, float] = {}
        quick = not detail and not self.bitwise
        for pos, leaf in self._candidates(ra, rb, names):
            if quick:  # only whether the row diverges: no LeafDiff for two numbers
                a, b = ra.number(leaf, self.pa), rb.number(leaf, self.pb)
                if a is not None and b is not None:
                    if values_equal(a, b, self.rel_tol, self.abs_tol):
                        continue
                    self._count_diverged(ra)
                    return None
            d = self._leaf(ra, rb, leaf, pos)
            if d is None:
                continue
            rels[leaf] = d[1]
            if d[0] is not None:
                if not detail:
                    self._count_diverged(ra)
                    return None
                diffs.append(d[0])
        return diffs, rels

    def _count_diverged(self, ra: DiagRow) -> None:
        """Count a diverging row whose details are not needed (in the table's count too)."""
        self.diverged += 1
        if self.table is not None:
            self.table.add(ra.phase, ra.step, None)

    def _candidates(self, ra: DiagRow, rb: DiagRow, names: list[str]) -> Any:
        """(position, leaf) of each leaf that is not plainly equal, in dataflow order. Plainly
        equal: the same digest (bitwise mode), or the same checksum — as a float, or as the
        number text of two rows read as text (equal texts are equal values)."""
        if self.bitwise:
            da_d, db_d = ra.digs, rb.digs
            if len(da_d) == len(names) and list(da_d) == names == list(db_d):
                return compress(enumerate(names), map(ne, da_d.values(), db_d.values()))
            return (
                (pos, leaf)
                for pos, leaf in enumerate(names)
                if (da := da_d.get(leaf)) is None or da != db_d.get(leaf)
            )
        ca_d, cb_d = ra.checks, rb.checks
        if ra.text and rb.text and list(ca_d) == names == list(cb_d):
            return compress(enumerate(names), map(ne, ca_d.values(), cb_d.values()))
        both_text = ra.text and rb.text
        return (
            (pos, leaf)
            for pos, leaf in enumerate(names)
            if (ca := ca_d.get(leaf)) is None
            or (type(ca) is not float and not both_text)
            or ca != cb_d.get(leaf)
        )

    def _leaf(
        self, ra: DiagRow, rb: DiagRow, leaf: str, pos: int
    ) -> tuple[LeafDiff | None, float] | None:
        ca, cb = ra.checks.get(leaf), rb.checks.get(leaf)
        a, b = ra.number(leaf, self.pa), rb.number(leaf, self.pb)
        if a is not None and b is not None:
            rel = relative_difference(a, b)
            delta = 0.0 if rel == 0.0 else abs(a - b)
        else:
            rel, delta = math.inf, math.inf
        da, db = ra.digs.get(leaf), rb.digs.get(leaf)
        if self.bitwise and da is not None and db is not None:
            equal, kind = da == db, "digest"
        elif self.bitwise and da is None and db is None and a is not None and b is not None:
            equal, kind = a == b or (math.isnan(a) and math.isnan(b)), "value"
        elif not self.bitwise and a is not None and b is not None:
            equal, kind = values_equal(a, b, self.rel_tol, self.abs_tol), "value"
        elif not self.bitwise and ca is None and cb is None and da is not None and db is not None:
            equal, kind = da == db, "digest"
        else:
            equal, kind = False, "missing"
        if equal:
            return None if rel == 0.0 else (None, rel)
        return LeafDiff(leaf, a, b, delta, rel, kind, pos), rel

    def _diverge(self, phase: str, step: int, div: Divergence, diffs: list[LeafDiff]) -> None:
        self.diverged += 1
        cur = self.best.get(phase)
        if cur is None or step < cur[0]:
            self.best[phase] = (step, div, diffs)

    def missing_row(self, row: DiagRow, missing_in: str) -> None:
        names = row.leaves()
        self._see_leaves(names)
        self.rows += 1
        if self.matrix is not None:
            self.matrix.append((row.phase, row.step, dict.fromkeys(names, math.inf), set(names)))
        div = Divergence(
            row.phase, row.step, None, None, None, math.inf, math.inf, "missing_row", missing_in
        )
        self._diverge(row.phase, row.step, div, [])
        if names:
            self._table_row(row.phase, row.step, names)

    def note_phase(self, row: DiagRow, side: dict[str, int]) -> None:
        if row.phase not in side:
            side[row.phase] = len(side)

    def rank(self, phase: str) -> tuple[int, int]:
        if phase in self.phase_a:
            return (0, self.phase_a[phase])
        return (1, self.phase_b.get(phase, 0))


def compare(
    run_a: str | os.PathLike[str],
    run_b: str | os.PathLike[str],
    *,
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-7,
    bitwise: bool = False,
    keep_matrix: bool = False,
    keep_table: bool = False,
    table_limit: int | None = None,
    common_leaves: bool = False,
) -> CompareResult:
    """Compare two runs (diag.jsonl files or run directories); see the module docstring.

    `keep_matrix` keeps the steps × leaves matrix (memory grows with the rows) and the table;
    `keep_table` only the per-step table of diverging leaves, and with `table_limit` only its
    first rows (memory flat in the rows; `table_rows` still counts them all). `common_leaves`
    compares only the leaves both runs record (runs of different frameworks: a twinrun run and a
    Trainer run with `DiagCallback`); the others are listed in `one_sided`.

    Raises DataError (exit code 2) for a missing file, an unreadable line (named file:line),
    a run without rows, or a (phase, step) recorded twice while still unmatched."""
    if rel_tol < 0 or abs_tol < 0:
        raise DataError("tolerances must be non-negative")
    if table_limit is not None and table_limit < 0:
        raise ValueError(f"table_limit must be >= 0, got {table_limit}")
    pa, pb = resolve_diag_path(run_a), resolve_diag_path(run_b)
    st = _Comparer(pa, pb, rel_tol, abs_tol, bitwise, common_leaves)
    if keep_matrix:
        st.matrix = []
    elif keep_table:
        st.table = _Table(table_limit)
    _pair_rows(st)
    return _result(st, table_limit)


_Pending = dict[tuple[str, int], DiagRow]  # rows of one run waiting for their partner


def _pair_rows(st: _Comparer) -> None:
    """Read both files once, in step, pairing rows by (phase, step): identical lines are
    counted without parsing twice; rows that arrive out of step wait for their partner."""
    pa, pb = st.pa, st.pb
    pend_a: _Pending = {}
    pend_b: _Pending = {}
    n_a = n_b = 0
    for la, lb in zip_longest(iter_lines(pa), iter_lines(pb)):
        if la is not None and lb is not None and la[1] == lb[1]:
            row = parse_row(la[1], pa, la[0])
            if row is None:
                continue
            n_a += 1
            n_b += 1
            key = (row.phase, row.step)
            if key not in pend_a and key not in pend_b:
                st.note_phase(row, st.phase_a)
                st.note_phase(row, st.phase_b)
                st.identical(row)
                continue
            ra: DiagRow | None = row
            rb: DiagRow | None = DiagRow(
                row.phase, row.step, row.checks, row.digs, lb[0], row.text, row.fmt
            )
        else:
            ra = None if la is None else parse_row(la[1], pa, la[0])
            rb = None if lb is None else parse_row(lb[1], pb, lb[0])
            n_a += ra is not None
            n_b += rb is not None
            if ra is not None and rb is not None and ra.phase == rb.phase and ra.step == rb.step:
                if not pend_a and not pend_b:  # aligned files: the usual case
                    st.note_phase(ra, st.phase_a)
                    st.note_phase(rb, st.phase_b)
                    st.pair(ra, rb)
                    continue
        _take(st, ra, pend_a, pend_b, in_a=True)
        _take(st, rb, pend_b, pend_a, in_a=False)
    _unpaired(st, (n_a, n_b), pend_a, pend_b)


def _take(
    st: _Comparer, row: DiagRow | None, mine: _Pending, other: _Pending, *, in_a: bool
) -> None:
    """A row of run A (`in_a`) or B read out of step (`mine` are its run's waiting rows): paired
    with the other run's waiting row of its (phase, step), else left waiting; DataError for a
    step recorded twice."""
    if row is None:
        return
    st.note_phase(row, st.phase_a if in_a else st.phase_b)
    path = st.pa if in_a else st.pb
    key = (row.phase, row.step)
    if key in other:
        o = other.pop(key)
        if in_a:
            st.pair(row, o)
        else:
            st.pair(o, row)
    elif key in mine:
        first = mine[key].lineno
        raise DataError(
            f"{path}:{row.lineno}: phase={row.phase} step={row.step} recorded twice "
            f"(first at line {first})",
            "a resumed run must not re-record steps",
        )
    else:
        mine[key] = row


def _unpaired(st: _Comparer, counts: tuple[int, int], pend_a: _Pending, pend_b: _Pending) -> None:
    """After both files: DataError for a run without rows; each row still waiting is a row the
    other run is missing."""
    for path, n in zip((st.pa, st.pb), counts, strict=True):
        if n == 0:
            raise DataError(f"{path}: no diag rows", "was the run started with --diag?")
    for row in pend_a.values():
        st.missing_row(row, "B")
    for row in pend_b.values():
        st.missing_row(row, "A")


def _result(st: _Comparer, table_limit: int | None) -> CompareResult:
    """The first divergence (earliest phase first), what co-diverges, the matrix and the
    trace comparison at the first divergence."""
    pa, pb, rel_tol, abs_tol, bitwise = st.pa, st.pb, st.rel_tol, st.abs_tol, st.bitwise
    first: Divergence | None = None
    co: list[LeafDiff] = []
    if st.best:
        phase = min(st.best, key=st.rank)
        _, first, diffs = st.best[phase]
        co = sorted(diffs, key=lambda d: (-d.rel, d.position))
    matrix = _matrix(st)
    table: list[DivergingRow] | None = None
    table_rows: int | None = None
    if matrix is not None:
        table = diverging_table(matrix)
        table_rows = len(table)
        table = table if table_limit is None else table[:table_limit]
    elif st.table is not None:
        table, table_rows = st.table.rows(st.rank), st.table.total
    first_module, note = None, None
    if first is not None:
        first_module, note = _first_module(pa, pb, first, rel_tol, abs_tol, bitwise)
    return CompareResult(
        path_a=str(pa),
        path_b=str(pb),
        rel_tol=rel_tol,
        abs_tol=abs_tol,
        bitwise=bitwise,
        deterministic=first is None,
        first=first,
        co_diverging=co,
        rows_compared=st.rows,
        rows_diverged=st.diverged,
        leaves=list(st.leaves),
        values_compared=st.values,
        matrix=matrix,
        first_module=first_module,
        trace_note=note,
        table=table,
        table_rows=table_rows,
        one_sided=dict(st.one_sided),
        digests_skipped=st.digests_skipped,
        formats=st.formats,
        bytes_differ=st.bytes_differ,
    )


def _matrix(st: _Comparer) -> DiffMatrix | None:
    """Steps × leaves relative differences, rows in phase then step order (`keep_matrix`)."""
    if st.matrix is None:
        return None
    st.matrix.sort(key=lambda r: (st.rank(r[0]), r[1]))
    leaves = list(st.leaves)
    return DiffMatrix(
        rows=[(p, s) for p, s, _, _ in st.matrix],
        leaves=leaves,
        rel=[[rels.get(leaf, math.nan) for leaf in leaves] for _, _, rels, _ in st.matrix],
        diverged=[[leaf in dv for leaf in leaves] for _, _, _, dv in st.matrix],
    )


def _first_module(
    pa: Path, pb: Path, first: Divergence, rel_tol: float, abs_tol: float, bitwise: bool
) -> tuple[TraceDivergence | None, str | None]:
    """Compare the two runs' step traces at the first divergence (see the module docstring)."""
    fa, fb = trace_path_for(pa), trace_path_for(pb)
    if not fa.is_file() and not fb.is_file():
        return None, None
    ta = read_trace(fa, first.step, first.phase)
    tb = read_trace(fb, first.step, first.phase)
    where = f"step={first.step}" + ("" if first.phase == "train" else f" phase={first.phase}")
    if ta is None or tb is None:
        lacking = (
            "runs A and B have"
            if ta is None and tb is None
            else ("run A has" if ta is None else "run B has")
        )
        return None, (
            f"{lacking} no trace at {where}: rerun both with --trace-step {first.step} to "
            "name the first module where they part"
        )
    div = compare_traces(
        ta, tb, step=first.step, phase=first.phase, rel_tol=rel_tol, abs_tol=abs_tol,
        exact=bitwise,
    )  # fmt: skip
    if div is None:
        return None, f"the traces at {where} agree entry for entry (the divergence is elsewhere)"
    return div, None


def format_number(x: float | None) -> str:
    """A leaf value as `twinrun diff` prints it: repr, or missing / nan / inf / -inf."""
    if x is None:
        return "missing"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def divergence_line(first: Divergence) -> str:
    """The `FIRST_DIVERGENCE: ...` line `twinrun diff` prints (phase added when it is not train)."""
    leaf = first.leaf if first.leaf is not None else "*"
    if first.kind == "missing_row":
        a = "missing" if first.missing_in == "A" else "row"
        b = "missing" if first.missing_in == "B" else "row"
    else:
        a, b = format_number(first.a), format_number(first.b)
    line = (
        f"FIRST_DIVERGENCE: step={first.step} leaf={leaf} run_A={a} run_B={b} "
        f"delta={format_number(first.delta)}"
    )
    if first.phase != "train":
        line += f" phase={first.phase}"
    return line
