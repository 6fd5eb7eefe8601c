"""The diag.jsonl recorder (format `twinrun.diag.v1`, docs/diagnostics.md).

One JSON object per line, appended and flushed as each step is committed (the file is a log,
never rewritten):

    {"format": "twinrun.diag.v1", "step": 3, "phase": "train",
     "checksums": {"batch.sample_indices": 1234.0, ...}, "digests": {"batch.sample_indices": "..."}}

Leaves keep the order they were added in, which must be dataflow order (what is computed first
comes first): `twinrun diff` names the *earliest* diverging leaf. Checksums are exact sums of
squares (`twinrun.diag.checksum.sumsq`) written with `repr`, so they read back bit-exact.
Non-finite checksums are written as the JSON strings "NaN", "Infinity" and "-Infinity" (strict
JSON, readable by any parser); `twinrun.diag.compare` reads those strings (and the bare
`NaN`/`Infinity` literals Python's json module emits) back as floats.

Usage in a user's own loop:

    rec = DiagRecorder("runs/a")                 # a directory: writes runs/a/diag.jsonl
    rec.record(step, {"batch.sample_indices": idx, "loss": loss, "grads.lora": grads})
    row = rec.begin(step)                        # or leaf by leaf, as values become available
    row.add("forward.logits", logits)
    row.add_parts("grads.lora", [g for g in lora_grads])
    rec.commit(row)

`record_later(step, leaves)` hands the row to a helper process instead (`twinrun.diag.helper`):
the caller's thread copies the leaves' bytes into shared memory and sends one small message; the
helper computes the checksums and digests and appends the line, while the next step runs, with
the same bytes `record` writes, in the order the rows were handed over. `start_background()`
starts the helper ahead of the first row (otherwise the first `record_later` does, and waits
for it). Where no helper can be started (or with TWINRUN_DIAG_HELPER=0) the rows are computed
on the recorder's one background thread, as before: the caller must then not change the
tensors it hands over until the row is written (snapshot what the next step updates in place),
and while the thread exists the interpreter's GIL switch interval is at most 0.5 ms (restored by
`close`): at CPython's default 5 ms, a training step that wants the GIL back from the checksum
thread waits up to 5 ms each time. `flush()` waits until every row handed over is on disk and
raises the first error met computing or writing one (as the same exception), or an OutputError
if the helper died; `close()` flushes and stops the helper. A row committed with `record` or
`commit` waits for the rows handed over before it.

The reading side (`resolve_diag_path`, `iter_lines`, `parse_row`, `decode_float`, `DiagRow`)
lives in `twinrun.diag.rows` and is re-exported here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from twinrun.diag.checksum import checksum_digest, checksum_digest_many
from twinrun.diag.flat import FlatLeaf
from twinrun.diag.helper import HelperUnavailable, RowHelper, enabled
from twinrun.diag.rows import (
    DIAG_FORMAT,
    DiagRow,
    decode_float,
    encode_float,
    iter_lines,
    parse_row,
    resolve_diag_path,
)

__all__ = [
    "DIAG_FORMAT",
    "DIAG_FILENAME",
    "STANDARD_LEAVES",
    "DiagRecorder",
    "DiagRow",
    "decode_float",
    "iter_lines",
    "parse_row",
    "resolve_diag_path",
    "LeafValue",
    "StepRecord",
    "encode_float",
    "leaf_value",
]

DIAG_FILENAME = "diag.jsonl"
SWITCH_INTERVAL_S = 0.0005  # while rows are computed in the background (see record_later)

#: The standard leaves in dataflow order (the GRPO leaves follow the sample indices).
STANDARD_LEAVES: tuple[str, ...] = (
    "batch.sample_indices",
    "replay.priorities",
    "replay.draws",
    "replay.sample_indices",
    "replay.weights",
    "rollout.tokens",
    "rollout.rewards",
    "rollout.advantages",
    "rollout.old_logprobs",
    "batch.tokens",
    "forward.logits",
    "loss",
    "grads.lora",
    "adam.exp_avg",
    "adam.exp_avg_sq",
    "params.lora",
    "lr",
    "rng.state",
)


@dataclass(frozen=True)
class LeafValue:
    """A leaf's precomputed checksum (exact sum of squares) and digest (SHA256 hex)."""

    checksum: float
    digest: str


def _is_part_list(value: Any) -> bool:
    """A list of tensors/arrays (a multi-part leaf), as opposed to a list of numbers."""
    if not isinstance(value, list | tuple) or not value:
        return False
    return all(hasattr(v, "shape") and hasattr(v, "dtype") for v in value)


def leaf_value(value: Any) -> LeafValue:
    """Checksum and digest of one leaf value: a tensor, numpy array, float, int, list of numbers,
    a list of tensors or a FlatLeaf (a multi-part leaf: merged checksum, `digest_many`), or a
    LeafValue."""
    if isinstance(value, LeafValue):
        return value
    if isinstance(value, FlatLeaf):
        return LeafValue(*value.checksum_digest())
    if _is_part_list(value):
        return LeafValue(*checksum_digest_many(value))
    if isinstance(value, list | tuple):
        import numpy as np

        value = np.asarray(value)
    return LeafValue(*checksum_digest(value))


class StepRecord:
    """One row being built: leaves are kept in the order they are added (dataflow order)."""

    def __init__(self, step: int, phase: str = "train") -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"diag step must be a non-negative integer, got {step!r}")
        if not isinstance(phase, str) or not phase:
            raise ValueError(f"diag phase must be a non-empty string, got {phase!r}")
        self.step = step
        self.phase = phase
        self.leaves: dict[str, LeafValue] = {}

    def add(self, leaf: str, value: Any) -> StepRecord:
        """Add one leaf (see `leaf_value` for what a value may be); returns self."""
        if not isinstance(leaf, str) or not leaf:
            raise ValueError(f"diag leaf name must be a non-empty string, got {leaf!r}")
        if leaf in self.leaves:
            raise ValueError(f"diag leaf {leaf!r} added twice at step {self.step}")
        self.leaves[leaf] = leaf_value(value)
        return self

    def add_parts(self, leaf: str, parts: Sequence[Any]) -> StepRecord:
        """Add a leaf made of several tensors in a fixed order; returns self."""
        return self.add(leaf, LeafValue(*checksum_digest_many(parts)))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": DIAG_FORMAT,
            "step": self.step,
            "phase": self.phase,
            "checksums": {k: encode_float(v.checksum) for k, v in self.leaves.items()},
            "digests": {k: v.digest for k, v in self.leaves.items()},
        }


class DiagRecorder:
    """Appends `twinrun.diag.v1` rows to a diag.jsonl file, one line per committed step.

    `path` is the file, or a directory (the file is `path/diag.jsonl`). With `append=False`
    (the default) an existing file is truncated when the recorder opens it; with `append=True`
    rows are added to it (resume). `fsync=True` also fsyncs every row. Use as a context manager
    or call `close()`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        phase_default: str = "train",
        *,
        append: bool = False,
        fsync: bool = False,
    ) -> None:
        p = Path(path)
        if p.is_dir() or (not p.suffix and not p.exists()):
            p = p / DIAG_FILENAME
        self.path = p
        self.phase_default = phase_default
        self._append = append
        self._fsync = fsync
        self._fh: TextIO | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._pending: list[Future[dict[str, Any]]] = []
        self._switch = 0.0
        self._helper: RowHelper | None = None
        self._tried = False  # whether a helper was started (or could not be)
        #: where `record_later` computes rows: "process" or "thread" (None until the first)
        self.background: str | None = None

    def _file(self) -> TextIO:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # append mode either way: the helper process appends to the same file
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            if not self._append:
                self._fh.truncate(0)
        return self._fh

    def start_background(self) -> None:
        """Start the helper process for `record_later` now, without waiting for it (a no-op
        once started, or where it cannot be)."""
        if self._tried:
            return
        self._tried = True
        if enabled():
            try:
                self._helper = RowHelper(self.path, self._fsync, leaf_value)
            except HelperUnavailable:
                self._helper = None

    def copies_at_hand_over(self) -> bool:
        """Whether `record_later` copies the leaves' bytes before it returns (into the helper's
        shared memory): the caller may then change its tensors at once, without a snapshot of
        its own. Starts the helper if need be and waits for it, as the first `record_later`."""
        if self.background is None:
            self._choose()
        return self.background == "process"

    def _choose(self) -> None:
        """At the first `record_later`: the helper once it is ready, else the thread."""
        self.start_background()
        if self._helper is not None:
            try:
                self._helper.wait_ready()
            except HelperUnavailable:
                self._helper.close()
                self._helper = None
        self.background = "thread" if self._helper is None else "process"

    def begin(self, step: int, phase: str | None = None) -> StepRecord:
        """Start a row; add leaves to it, then `commit` it."""
        return StepRecord(step, phase or self.phase_default)

    def commit(self, row: StepRecord) -> dict[str, Any]:
        """Append the row as one line and flush it; returns the JSON object written."""
        obj = row.to_json()
        if self._helper is not None and self._helper.sent > self._helper.acked:
            self._helper.flush()  # the rows handed over come first
        fh = self._file()
        fh.write(json.dumps(obj, allow_nan=False) + "\n")
        fh.flush()
        if self._fsync:
            os.fsync(fh.fileno())
        return obj

    def record(self, step: int, leaves: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
        """Record one step: `leaves` maps leaf name -> value, in dataflow order."""
        row = self.begin(step, phase)
        for leaf, value in leaves.items():
            row.add(leaf, value)
        return self.commit(row)

    def record_later(self, step: int, leaves: dict[str, Any], phase: str | None = None) -> None:
        """`record` on the background thread (rows keep their order); see the module docstring.
        A row that could not be written raises here, at the next hand-over, or at `flush`."""
        self.begin(step, phase)  # a bad step or phase fails now, in the caller
        if self.background is None:
            self._choose()
        if self._helper is not None:
            self._file()  # created (or truncated) before the helper appends to it
            self._helper.submit(step, phase or self.phase_default, leaves)
            return
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for f in done:
            f.result()
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="twinrun-diag")
            # the main thread gets the GIL back within 0.5 ms, not CPython's default 5 ms
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL_S))
        self._pending.append(self._worker.submit(self.record, step, leaves, phase))

    def flush(self) -> None:
        """Wait until every row handed to `record_later` is written; raise the first error."""
        self._flush()

    def _flush(self, again: bool = True) -> None:
        if self._helper is not None:
            self._helper.flush(again)
        pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        try:
            self._flush(again=False)  # a dead helper's error is raised once, not again here
        finally:
            if self._helper is not None:
                self._helper.close()
                self._helper = None
            self._tried, self.background = False, None
            if self._worker is not None:
                self._worker.shutdown(wait=True, cancel_futures=True)
                self._worker = None
                sys.setswitchinterval(self._switch)
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> DiagRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
