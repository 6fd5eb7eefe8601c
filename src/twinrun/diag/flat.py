"""Several multi-part float32 leaves kept in one flat buffer and checksummed together.

A training step's LoRA leaves (the gradients, both Adam moments, the parameters) are each made
of many small float32 tensors. `FlatLeaves` copies all of their parts into one contiguous
buffer with one call (a snapshot: the next step's in-place updates do not reach it), and
computes every leaf's checksum and digest together:

* each leaf's checksum over its own span of the buffer (`twinrun.diag.checksum.sumsq`: a few
  vector passes over contiguous float32, the exact path only where those cannot decide);
* each leaf's digest over its own span of the buffer, every part framed by its own shape.

`FlatLeaves(...).leaf(i)` is what a row holds for leaf i; `DiagRecorder` computes the group the
first time one of its leaves is asked for. The checksum and digest of leaf i are exactly
`checksum_digest_many(leaves[i])`: the same merged sum of squares and the same digest bytes.
"""

from __future__ import annotations

import hashlib
import math
import sys
from typing import Any

from twinrun.diag.checksum import _LITTLE, _header, sumsq

__all__ = ["FlatLeaf", "FlatLeaves"]

Shapes = tuple[tuple[int, ...], ...]
_layouts: dict[Shapes, list[tuple[bytes, int, int]]] = {}
_groups: dict[Any, tuple[list[Shapes], list[int]]] = {}


class FlatLeaves:
    """The float32 CPU parts of several leaves, copied into one buffer (see the module
    docstring). `fits(parts)` says whether a leaf's parts can be kept this way."""

    __slots__ = ("flat", "parts", "key", "shapes", "counts", "_results")

    def __init__(self, leaves: list[list[Any]], copy: bool = True) -> None:
        """With `copy=False` the parts are not copied now: `copy_into` copies them later (what
        a recorder that copies at the hand-over does), or the first `results` does."""
        parts = [p for leaf in leaves for p in leaf]
        self.flat: Any = None
        self.parts: list[Any] | None = parts
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

    def copy_into(self, out: Any, views: dict[Any, list[Any]]) -> None:
        """Copy the parts, laid end to end, into `out` (a 1-D float32 torch tensor as long as
        the group) with one call; `views` caches the parts' views of `out` by layout. The
        group itself keeps what it had."""
        import torch

        if self.parts is None:
            out.copy_(torch.from_numpy(self.array()))
            return

        key = (out.data_ptr(), self.key)
        dsts = views.get(key)
        if dsts is None:
            dsts, start = [], 0
            for p in self.parts:
                n = p.numel()
                dsts.append(out[start : start + n].view(p.shape))
                start += n
            if len(views) >= 16:
                views.clear()
            views[key] = dsts
        with torch.no_grad():
            torch._foreach_copy_(dsts, self.parts)

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
            self._results = list(zip(self._checksums(), self._digests(), strict=True))
        return self._results

    def _checksums(self) -> list[float]:
        a = self.array()
        out, start = [], 0
        for n in self.counts:
            out.append(sumsq(a[start : start + n]))
            start += n
        return out

    def _digests(self) -> list[str]:
        mv = memoryview(self.array()).cast("B")
        out, base = [], 0
        for shapes, n in zip(self.shapes, self.counts, strict=True):
            pieces: list[bytes | memoryview] = [b"twinrun.tensors.v1\0"]
            for head, start, stop in _flat_layout(shapes):
                pieces += (head, mv[base + start : base + stop])
            out.append(hashlib.sha256(b"".join(pieces)).hexdigest())
            base += 4 * n
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
