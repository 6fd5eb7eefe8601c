"""The diag helper process itself (started by `twinrun.diag.helper.RowHelper`): reads row
messages from its pipe, computes each row from the parts in shared memory with the functions
`DiagRecorder.record` uses, appends the line to diag.jsonl and acknowledges it.

It imports numpy and twinrun.diag only (torch only if a leaf ever needs torch's general path,
e.g. a float64 leaf of more than 64 values); it ignores SIGINT (the training process decides
when to stop) and exits when told to, or when the training process's end of the pipe closes.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import pickle
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any, TextIO


def main(rfd: int, wfd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rx = Connection(rfd, writable=False)
    tx = Connection(wfd, readable=False)
    try:
        kind, path, fsync, ctl = rx.recv()
        assert kind == "config"
        import _posixshmem  # type: ignore[import-not-found]  # noqa: F401

        import numpy as np

        from twinrun.diag import recorder  # noqa: F401

        helper = Helper(tx, path, fsync)
        helper.words = np.frombuffer(helper.attach(ctl), dtype=np.int64, count=2)
    except EOFError:  # pragma: no cover - the training process is gone
        return
    except Exception as e:  # pragma: no cover - an interpreter without numpy or POSIX shm
        tx.send(("unavailable", f"{type(e).__name__}: {e}"))
        return
    yield_cpu()  # after the imports, which overlap the training process's own set-up
    tx.send(("ready", os.getpid()))
    helper.serve(rx)


def yield_cpu() -> None:
    """SCHED_BATCH where Linux has it: a woken helper then never preempts the training loop on
    its core (writing a row's message to the pipe would otherwise hand the loop's core to the
    helper for the row's work: ~2 ms a step measured on 2 busy CPUs), yet on a saturated
    machine it still gets its fair share (SCHED_IDLE would starve it, and the final flush with
    it). Elsewhere, a lower priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass
    try:  # pragma: no cover
        os.nice(5)
    except OSError:  # pragma: no cover
        pass


class Helper:
    def __init__(self, tx: Connection, path: str, fsync: bool) -> None:
        self.tx = tx
        self.maps: dict[str, mmap.mmap] = {}
        self.path = path
        self.fsync = fsync
        self.fh: TextIO | None = None
        self.words: Any = None  # the control words: [last row done, errors sent]

    def serve(self, rx: Connection) -> None:
        try:
            while True:
                try:
                    msg = rx.recv()
                except (EOFError, OSError):  # the training process is gone
                    break
                kind = msg[0]
                if kind == "row":
                    self.row(*msg[1:])
                elif kind == "drop":
                    self.drop(msg[1])
                elif kind == "stop":
                    break
        finally:
            if self.fh is not None:
                self.fh.close()
            self.words = None
            for name in list(self.maps):
                self.drop(name)

    def attach(self, name: str) -> mmap.mmap:
        buf = self.maps.get(name)
        if buf is None:
            import _posixshmem

            fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
            try:
                buf = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            self.maps[name] = buf
        return buf

    def drop(self, name: str) -> None:
        buf = self.maps.pop(name, None)
        if buf is not None:
            try:
                buf.close()
            except BufferError:  # pragma: no cover - a view still held: freed with it
                pass

    def row(
        self, seq: int, step: int, phase: str, seg: str | None, specs: list[Any], groups: list[Any]
    ) -> None:
        try:
            line = self.line(step, phase, seg, specs, groups)
            if self.fh is None:
                self.fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
            self.fh.write(line)
            self.fh.flush()
            if self.fsync:
                os.fsync(self.fh.fileno())
        except Exception as e:
            try:
                blob: bytes | None = pickle.dumps(e)
            except Exception:
                blob = None
            self.tx.send(("error", seq, blob, f"{type(e).__name__}: {e}", traceback.format_exc()))
            self.words[1] += 1  # after the message: the training process reads it without a wait
        self.words[0] = seq

    def line(
        self, step: int, phase: str, seg: str | None, specs: list[Any], groups: list[Any]
    ) -> str:
        from twinrun.diag.flat import FlatLeaves
        from twinrun.diag.recorder import LeafValue, StepRecord, leaf_value

        buf = self.attach(seg) if seg is not None else None
        flat = [
            FlatLeaves.from_array(_view(buf, "float32", (sum(counts),), off), shapes, counts)
            for off, shapes, counts in groups
        ]
        row = StepRecord(step, phase)
        for leaf, spec in specs:
            kind = spec[0]
            if kind == "t":
                value = LeafValue(*one(*_part(buf, spec[1])))
            elif kind == "p":
                value = LeafValue(*many([_part(buf, p) for p in spec[1]]))
            elif kind == "f":
                value = LeafValue(*flat[spec[1]].results()[spec[2]])
            elif kind == "o":
                value = leaf_value(spec[1])
            else:  # "v": computed by the training process
                value = LeafValue(spec[1], spec[2])
            row.add(leaf, value)
        return json.dumps(row.to_json(), allow_nan=False) + "\n"


Part = tuple[str, tuple[int, ...], Any]


def _view(buf: Any, name: str, shape: tuple[int, ...], offset: int) -> Any:
    """A numpy view of a part's bytes in the segment (bfloat16: its raw uint16 bits)."""
    import math

    import numpy as np

    dtype = np.dtype(np.uint16 if name == "bfloat16" else name)
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset).reshape(shape)


def _part(buf: Any, part: tuple[str, tuple[int, ...], int]) -> Part:
    name, shape, offset = part
    return name, tuple(shape), _view(buf, name, tuple(shape), offset)


def _values(name: str, arr: Any) -> Any:
    """What `sumsq` squares: bfloat16 bits widened to float32 (exact), as torch's `.float()`."""
    if name != "bfloat16":
        return arr
    import numpy as np

    return (arr.astype(np.uint32) << 16).view(np.float32)


def one(name: str, shape: tuple[int, ...], arr: Any) -> tuple[float, str]:
    """`checksum_digest` of a tensor of dtype `name` and shape `shape` with `arr`'s bytes."""
    from twinrun.diag.checksum import SumSq, _header

    h = hashlib.sha256(b"twinrun.tensor.v1\0")
    h.update(_header(name, shape, arr.nbytes))
    h.update(arr)
    return SumSq().add(_values(name, arr)).value(), h.hexdigest()


def many(parts: list[Part]) -> tuple[float, str]:
    """`checksum_digest_many` of tensors given as (dtype name, shape, bytes as an array)."""
    from twinrun.diag.checksum import SumSq, _header

    acc = SumSq()
    h = hashlib.sha256(b"twinrun.tensors.v1\0")
    h.update(len(parts).to_bytes(8, "big"))
    for name, shape, arr in parts:
        acc.add(_values(name, arr))
        h.update(_header(name, shape, arr.nbytes))
        h.update(arr)
    return acc.value(), h.hexdigest()
