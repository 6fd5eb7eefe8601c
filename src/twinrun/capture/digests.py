"""The two digests of an optimizer batch.

Both are framed SHA256: the hash is fed a sequence of frames, each `u64be(len(name)) name
u64be(len(data)) data`, so no two different batches can feed the same bytes. Integers are int64
big-endian, floats float64 big-endian (their exact bits: -0.0, 0.0 and every NaN differ), masks
one byte each.

- **logical** (`optimizer/logical_batch_sha256`): *what* the optimizer saw — the rows in order.
  Frames: `format`, `objective`, `denominator`, `row_offsets`, `tokens`, `loss_mask`, then each
  per-objective array in name order as `<name>:<layout>` (e.g. `floats.old_logprobs:token`). It
  does not depend on how the rows were split into forwards or padded.
- **effective rows** (`optimizer/effective_rows_sha256`): *how* the backend used them — for each
  forward, the right-padded `[B, W]` matrices it ran on (input ids with the tokenizer's pad id,
  attention mask, loss mask, per-token floats padded with 0.0) and its per-row values. A
  different forward split, pad id or padding changes it; the logical digest stays.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from twinrun.capture.payload import FORMAT, BatchArrays

CHUNK = 1 << 18  # elements converted to big-endian at a time (bounded memory)


class Framed:
    """A SHA256 fed with named frames."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def frame(self, name: str, data: bytes | np.ndarray, dtype: str | None = None) -> None:
        label = name.encode()
        self.h.update(len(label).to_bytes(8, "big") + label)
        if isinstance(data, bytes):
            self.h.update(len(data).to_bytes(8, "big") + data)
            return
        a = np.ascontiguousarray(data).reshape(-1)
        be = np.dtype(dtype) if dtype is not None else a.dtype.newbyteorder(">")
        self.h.update((a.size * be.itemsize).to_bytes(8, "big"))
        if a.dtype == be:
            self.h.update(a.data.cast("B"))
            return
        out = np.empty(min(CHUNK, a.size), dtype=be)  # reused: converting is then memory-speed
        for start in range(0, a.size, CHUNK):
            n = min(CHUNK, a.size - start)
            out[:n] = a[start : start + n]
            self.h.update(out[:n].data.cast("B"))

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def logical_sha256(a: BatchArrays) -> str:
    h = Framed()
    h.frame("format", f"{FORMAT}/logical".encode())
    h.frame("objective", a.objective.encode())
    h.frame("denominator", _i64(a.denominator), ">i8")
    h.frame("row_offsets", a.offsets, ">i8")
    h.frame("tokens", a.tokens, ">i8")
    h.frame("loss_mask", a.loss_mask, "u1")
    for key in sorted(a.extras):
        layout, values = a.extras[key]
        h.frame(f"{key}:{layout}", values, ">f8" if key.startswith("floats.") else ">i8")
    return h.hexdigest()


def forwards(a: BatchArrays, pad_id: int) -> list[dict[str, Any]]:
    """The padded matrices of each forward, as the trainers build them (right padding to the
    forward's longest row)."""
    out = []
    lengths = a.lengths
    start = 0
    for size in a.forward_sizes.tolist():
        stop = start + size
        lens = lengths[start:stop]
        width = int(lens.max())
        real = np.arange(width)[None, :] < lens[:, None]  # row-major True = concatenated tokens
        lo, hi = int(a.offsets[start]), int(a.offsets[stop])
        ids = np.full((size, width), pad_id, dtype=np.int64)
        ids[real] = a.tokens[lo:hi]
        mask = np.zeros((size, width), dtype=np.uint8)
        mask[real] = a.loss_mask[lo:hi]
        fw: dict[str, Any] = {"ids": ids, "attention": real.astype(np.uint8), "mask": mask}
        for key, (layout, values) in sorted(a.extras.items()):
            if layout == "token":
                padded = np.zeros((size, width), dtype=values.dtype)
                padded[real] = values[lo:hi]
                fw[key] = padded
            else:
                fw[key] = values[start:stop]
        out.append(fw)
        start = stop
    return out


def effective_rows_sha256(a: BatchArrays, pad_id: int) -> str:
    h = Framed()
    h.frame("format", f"{FORMAT}/effective_rows".encode())
    h.frame("objective", a.objective.encode())
    h.frame("denominator", _i64(a.denominator), ">i8")
    h.frame("pad_id", _i64(pad_id), ">i8")
    for fw in forwards(a, pad_id):
        h.frame("forward", _i64(*fw["ids"].shape), ">i8")
        h.frame("input_ids", fw["ids"], ">i8")
        h.frame("attention_mask", fw["attention"], "u1")
        h.frame("loss_mask", fw["mask"], "u1")
        for key in sorted(k for k in fw if "." in k):
            h.frame(key, fw[key], ">f8" if key.startswith("floats.") else ">i8")
    return h.hexdigest()


def padding_fraction(a: BatchArrays) -> float:
    """Mean over forwards of the padded share of the forward's [B, W] matrix."""
    fractions = []
    lengths = a.lengths
    start = 0
    for size in a.forward_sizes.tolist():
        lens = lengths[start : start + size]
        fractions.append(1.0 - float(lens.sum()) / (int(lens.max()) * size))
        start += size
    return sum(fractions) / len(fractions)
