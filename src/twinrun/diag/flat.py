"""Several multi-part float32 leaves kept in one flat buffer and checksummed together.

A training step's LoRA leaves (the gradients, both Adam moments, the parameters) are each made
of many small float32 tensors. `FlatLeaves` copies all of their parts into one contiguous
buffer with one call (a snapshot: the next step's in-place updates do not reach it), and
computes every leaf's checksum and digest together:

* each leaf's checksum over its own span of the buffer (`twinrun.diag.checksum.sumsq`: a few
  vector passes over contiguous float32, the exact path only where those cannot decide);
  leaves of one length — the LoRA leaves — as the rows of one array, in the passes of one;
* each leaf's digest over its own span of the buffer, every part framed by its own shape.

`FlatLeaves(...).leaf(i)` is what a row holds for leaf i; `DiagRecorder` computes the group the
first time one of its leaves is asked for. The checksum and digest of leaf i are exactly
`checksum_digest_many(leaves[i])`: the same merged sum of squares and the same digest bytes.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

from twinrun.diag.checksum import _LITTLE, SumSq, _header, leaf_hasher, sumsq
from twinrun.diag.extract import rounded_sumsq_rows

__all__ = ["FlatLeaf", "FlatLeaves"]

Shapes = tuple[tuple[int, ...], ...]
_layouts: dict[Shapes, list[tuple[bytes, int, int]]] = {}
_groups: dict[Any, tuple[list[Shapes], list[int]]] = {}
_workspace = threading.local()  # the buffer `results` copies into, and its views by layout


class FlatLeaves:
    """The float32 CPU parts of several leaves, copied into one buffer (see the module
    docstring). `fits(parts)` says whether a leaf's parts can be kept this way."""

    __slots__ = ("flat", "parts", "spans", "key", "shapes", "counts", "_results")

    def __init__(
        self, leaves: list[list[Any]], copy: bool = True, spans: list[Any] | None = None
    ) -> None:
        """With `copy=False` the parts are not copied now: the first `results` copies them into
        a buffer this thread reuses (a row computed before the parts change needs no copy of its
        own, and a fresh one each step costs the memory's page faults). `spans`: each leaf's
        own buffer (see `over_tiles`), read in place."""
        parts = [p for leaf in leaves for p in leaf]
        self.flat: Any = None
        self.parts: list[Any] | None = parts
        self.spans: list[Any] | None = spans
        if copy:
            self._copy()
        # the layout, computed once per set of shapes (the same at every step of a run)
        self.key: Any = (tuple([len(leaf) for leaf in leaves]), tuple([p.shape for p in parts]))
        layout = _groups.get(self.key)
        if layout is None:
            layout = (
                [tuple(tuple(p.shape) for p in leaf) for leaf in leaves],
                [sum(p.numel() for p in leaf) for leaf in leaves],
            )
            if len(_groups) >= 64:
                _groups.clear()
            _groups[self.key] = layout
        self.shapes: list[Shapes] = layout[0]
        self.counts: list[int] = layout[1]
        self._results: list[tuple[float, str]] | None = None

    def _copy(self) -> None:
        import torch
        from torch._utils import _flatten_dense_tensors

        with torch.no_grad():
            self.flat = _flatten_dense_tensors(self.parts)
        self.parts = None

    @classmethod
    def over_tiles(cls, leaves: list[list[Any]]) -> FlatLeaves | None:
        """The group read in place, when each leaf's parts are float32 CPU tensors that tile one
        buffer of their own (`twinrun.core.tiles`: a training run's LoRA leaves): no copy; the
        row must be computed before the parts change. None when any leaf's parts do not."""
        torch = sys.modules.get("torch")
        if torch is None or not _LITTLE or not leaves:
            return None
        from twinrun.core.tiles import span

        spans = []
        for leaf in leaves:
            buf = span(leaf)
            if buf is None or buf.dtype is not torch.float32 or not buf.is_cpu:
                return None
            spans.append(buf)
        return cls(leaves, copy=False, spans=spans)

    @staticmethod
    def fits(parts: list[Any]) -> bool:
        """Whether a leaf's `parts` can be kept flat: one or more float32 CPU tensors."""
        torch = sys.modules.get("torch")
        return (
            torch is not None
            and len(parts) > 0
            and _LITTLE
            and all(isinstance(x, torch.Tensor) and x.dtype is torch.float32 and x.is_cpu
                    for x in parts)
        )  # fmt: skip

    def array(self) -> Any:
        """The flat buffer as a numpy array (a view)."""
        if self.flat is None:
            self._copy()
        return self.flat.numpy() if hasattr(self.flat, "numpy") else self.flat

    def leaf(self, i: int) -> FlatLeaf:
        """Leaf i, as a value for a diag row."""
        return FlatLeaf(self, i)

    def results(self) -> list[tuple[float, str]]:
        """(checksum, digest) of every leaf, computed once."""
        if self._results is None:
            if self.spans is not None:
                arrays = [t.numpy() for t in self.spans]
            else:
                if self.parts is None:
                    a = self.array()
                else:
                    a = _in_workspace(self.parts, self.key, sum(self.counts))
                arrays, start = [], 0
                for n in self.counts:
                    arrays.append(a[start : start + n])
                    start += n
            self._results = list(zip(self._checksums(arrays), self._digests(arrays), strict=True))
        return self._results

    def _checksums(self, arrays: list[Any]) -> list[float]:
        counts = self.counts
        if len(set(counts)) == 1 and counts[0] > 0:  # the LoRA leaves: one shape each
            rows = rounded_sumsq_rows(arrays)
            return [  # a row the extraction left undecided (a midpoint): the exact sum
                SumSq().add(a).value() if v is None else v
                for a, v in zip(arrays, rows, strict=True)
            ]
        return [sumsq(a) for a in arrays]

    def _digests(self, arrays: list[Any]) -> list[str]:
        out = []
        for shapes, a in zip(self.shapes, arrays, strict=True):
            mv = memoryview(a).cast("B")
            h = leaf_hasher(b"twinrun.tensors.v1\0")
            for head, start, stop in _flat_layout(shapes):
                h.update(head)
                h.update(mv[start:stop])
            out.append(h.hexdigest())
        return out


class FlatLeaf:
    """One leaf of a `FlatLeaves` group, as a diag row holds it."""

    __slots__ = ("group", "index")

    def __init__(self, group: FlatLeaves, index: int) -> None:
        self.group = group
        self.index = index

    def checksum_digest(self) -> tuple[float, str]:
        """Exactly `checksum_digest_many` of the leaf's parts (as they were when copied)."""
        return self.group.results()[self.index]


def _in_workspace(parts: list[Any], key: Any, n: int) -> Any:
    """The parts (`n` values, laid out as `key` says) copied end to end with one call into this
    thread's reusable float32 buffer; a numpy view of the copy, valid until the thread's next
    call."""
    import torch

    ws = _workspace.__dict__
    if ws.get("buf") is None or ws["buf"].numel() < n:
        ws["buf"], ws["views"] = torch.empty(max(n, 1), dtype=torch.float32), {}
    buf, views = ws["buf"], ws["views"]
    dsts = views.get(key)
    if dsts is None:
        dsts, start = [], 0
        for p in parts:
            dsts.append(buf[start : start + p.numel()].view(p.shape))
            start += p.numel()
        if len(views) >= 16:
            views.clear()
        views[key] = dsts
    with torch.no_grad():
        torch._foreach_copy_(dsts, parts)
    return buf[:n].numpy()


def _flat_layout(shapes: Shapes) -> list[tuple[bytes, int, int]]:
    """For float32 parts of these shapes laid end to end: each part's frame header and byte
    span (the part count leads the first header, as `digest_many` hashes it)."""
    layout = _layouts.get(shapes)
    if layout is None:
        layout, start = [], 0
        for i, shape in enumerate(shapes):
            nbytes = 4 * math.prod(shape)
            head = _header("float32", shape, nbytes)
            layout.append(((len(shapes).to_bytes(8, "big") if i == 0 else b"") + head, start,
                           start + nbytes))  # fmt: skip
            start += nbytes
        if len(_layouts) >= 64:
            _layouts.clear()
        _layouts[shapes] = layout
    return layout
