"""The diag.jsonl recorder (format `twinrun.diag.v1`, docs/diagnostics.md).

One JSON object per line, appended and flushed as each step is committed (the file is a log,
never rewritten):

    {"format": "twinrun.diag.v2", "step": 3, "phase": "train",
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

Rows are computed and written on the caller's thread, in the call: the cost is the row's own
work (the checksums and digests: about a millisecond on the toy model, bench/diag_overhead.py),
the same on a busy machine as on an idle one, with no thread, process or spare core to rely on.
`record_later(step, leaves)` is `record` for callers that hand rows over as the step ends (the
diag hook): the row is on disk when it returns, so the caller may change its tensors at once.
`flush()` has nothing left to wait for and `close()` closes the file.

Each row is one `write` of the whole line to a file opened for appending, unbuffered: a row is
on disk (in the OS's cache; with `fsync=True` synced) as soon as it is committed, and a write that
fails (a full disk) is an OutputError naming the file, with the partial line cut off again, so
the file holds whole rows only.

The reading side (`resolve_diag_path`, `iter_lines`, `parse_row`, `decode_float`, `DiagRow`)
lives in `twinrun.diag.rows` and is re-exported here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.core.fileio import write_failed
from twinrun.core.ledger import note_written
from twinrun.diag.checksum import checksum_digest, checksum_digest_many
from twinrun.diag.flat import FlatLeaf
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
    "HF_LEAVES",
    "TRAINER_ROW_LEAVES",
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

#: The leaves `twinrun.integrations.hf.DiagCallback` (a Trainer run) can record, in dataflow
#: order; a LoRA run's `.trainable` leaves are written under `.lora` (`TRAINER_ROW_LEAVES`).
HF_LEAVES: tuple[str, ...] = (
    "batch.tokens",
    "forward.logits",
    "loss",
    "grads.trainable",
    "adam.exp_avg",
    "adam.exp_avg_sq",
    "params.trainable",
    "lr",
    "rng.state",
)
TRAINER_ROW_LEAVES = frozenset(HF_LEAVES) | {"grads.lora", "params.lora"}


@dataclass(frozen=True)
class LeafValue:
    """A leaf's precomputed checksum (exact sum of squares) and digest (XXH3-128 hex)."""

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

    def to_line(self) -> str:
        """The row's line: `json.dumps(self.to_json(), allow_nan=False)`, built directly when
        the phase and every leaf name are plain (printable ASCII, no quote or backslash), which
        they are for the rows twinrun writes; through `json.dumps` otherwise."""
        names = self.leaves.keys()
        if not (_plain(self.phase) and all(_plain(k) for k in names)):
            return json.dumps(self.to_json(), allow_nan=False)
        checks = ", ".join(f'"{k}": {_number(v.checksum)}' for k, v in self.leaves.items())
        digests = ", ".join(f'"{k}": "{v.digest}"' for k, v in self.leaves.items())
        return (
            f'{{"format": "{DIAG_FORMAT}", "step": {int(self.step)}, "phase": "{self.phase}", '
            f'"checksums": {{{checks}}}, "digests": {{{digests}}}}}'
        )


_plain_names: set[str] = set()  # names checked plain already


def _plain(name: str) -> bool:
    """Whether `json.dumps` writes `name` as itself between quotes."""
    if name in _plain_names:
        return True
    if not (name.isascii() and name.isprintable() and '"' not in name and "\\" not in name):
        return False
    if len(_plain_names) < 4096:
        _plain_names.add(name)
    return True


def _number(x: float) -> str:
    """A checksum as `json.dumps` writes `encode_float(x)`."""
    return repr(float(x)) if math.isfinite(x) else json.dumps(encode_float(x))


class DiagRecorder:
    """Appends `twinrun.diag.v1` rows to a diag.jsonl file, one line per committed step.

    `path` is the file, or a directory (the file is `path/diag.jsonl`). With `append=False`
    (the default) an existing file is truncated when the recorder opens it (at the first row);
    with `append=True` rows are added to it (resume). `fsync=True` also fsyncs every row. Use as
    a context manager or call `close()`.
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
        self._fh: Any = None  # the raw (unbuffered) file, opened at the first row
        self._size = 0  # the file's length after the last whole row

    def _file(self) -> Any:
        if self._fh is None:
            fh = None
            try:
                note_written(self.path)  # listed before its folder is made
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fh = open(self.path, "ab", buffering=0)  # noqa: SIM115
                if not self._append:
                    fh.truncate(0)  # a fresh log: once (opened again, it is continued)
                    self._append = True
                self._size = os.fstat(fh.fileno()).st_size
            except OSError as exc:
                if fh is not None:
                    fh.close()
                raise write_failed(self.path, exc) from exc
            self._fh = fh
        return self._fh

    def begin(self, step: int, phase: str | None = None) -> StepRecord:
        """Start a row; add leaves to it, then `commit` it."""
        return StepRecord(step, phase or self.phase_default)

    def commit(self, row: StepRecord) -> dict[str, Any]:
        """Append the row as one line, written through to the OS; returns the JSON object."""
        obj = row.to_json()
        data = (row.to_line() + "\n").encode("utf-8")
        fh = self._file()
        try:
            rest = memoryview(data)
            while rest:
                rest = rest[fh.write(rest) :]  # one write, unless the OS takes part of it
            if self._fsync:
                os.fsync(fh.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fh.fileno(), self._size)  # whole rows only
            raise write_failed(self.path, exc) from exc
        self._size += len(data)
        return obj

    def record(self, step: int, leaves: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
        """Record one step: `leaves` maps leaf name -> value, in dataflow order."""
        row = self.begin(step, phase)
        for leaf, value in leaves.items():
            row.add(leaf, value)
        return self.commit(row)

    def record_later(self, step: int, leaves: dict[str, Any], phase: str | None = None) -> None:
        """`record`, for callers that hand the row over as a step ends: the row is computed and
        written before this returns (see the module docstring), so a bad row raises here."""
        self.record(step, leaves, phase)

    def flush(self) -> None:
        """Every row is written as it is recorded: nothing to wait for (kept for callers that
        flush before a checkpoint)."""

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            fh.close()

    def __enter__(self) -> DiagRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
