"""Shared memory for the diag helper process (`twinrun.diag.helper`): the segments rows are copied
into, the small control segment the helper reports its progress in, and which values can go
there. A segment's name is unlinked from /dev/shm once (`unlink_once`); its mappings stay valid.
"""

from __future__ import annotations

import os
import secrets
import sys
from typing import Any

from twinrun.diag.checksum import _NUMPY_OK, _np_name
from twinrun.diag.flat import FlatLeaves

MAX_BYTES = 256 << 20  # the rows' bytes in flight, at most (or half of /dev/shm's free space)
SHM_DTYPES = frozenset(_NUMPY_OK | {"bfloat16"})
_torch_names: dict[Any, str | None] = {}  # torch dtype -> its name where shm can hold it


def shm_dtype(x: Any) -> str | None:
    """The dtype name under which `x`'s bytes can go into shared memory, else None."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.layout is not torch.strided:
            return None
        name = _torch_names.get(x.dtype, "")
        if name == "":
            text = str(x.dtype)[6:]  # "torch.float32" -> "float32"
            name = _torch_names[x.dtype] = text if text in SHM_DTYPES else None
        return name
    np = sys.modules.get("numpy")
    if np is not None and type(x) is np.ndarray:
        return _np_name(x.dtype)  # native byte order only
    return None


def nbytes_of(x: Any) -> int:
    if isinstance(x, FlatLeaves):
        return 4 * sum(x.counts)
    nbytes = getattr(x, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return int(x.numel()) * int(x.element_size())


def new_shm(size: int) -> Any:
    from multiprocessing.shared_memory import SharedMemory

    name = f"twinrun_diag_{os.getpid()}_{secrets.token_hex(4)}"
    return SharedMemory(name=name, create=True, size=size)


class Segment:
    """One shared-memory segment, with numpy and (when needed) torch byte views of it."""

    __slots__ = ("shm", "name", "size", "u8", "t", "views", "first", "last", "named")

    def __init__(self, size: int) -> None:
        import numpy as np

        self.shm = new_shm(size)
        self.name = self.shm.name
        self.size = size
        self.u8: Any = np.frombuffer(self.shm.buf, dtype=np.uint8, count=size)
        self.t: Any = None
        self.views: dict[Any, list[Any]] = {}  # FlatLeaves.copy_into's views of the segment
        self.first = -1  # the first row that used it (the helper maps it then)
        self.last = -1  # the last row that used it
        self.named = True

    def unlink(self) -> None:
        unlink_once(self)

    def close(self) -> None:
        self.t = self.u8 = None
        self.views.clear()
        try:
            self.shm.close()
        except BufferError:  # pragma: no cover - a view still held: the mapping goes with it
            pass
        self.unlink()

    def copy_in(self, offset: int, x: Any, nbytes: int) -> None:
        """Copy `x`'s bytes to `offset`: CPU data with numpy (one thread, never an OpenMP
        region, which stalls on a busy machine), a tensor on another device with torch."""
        dst = self.u8[offset : offset + nbytes]
        torch = sys.modules.get("torch")
        if isinstance(x, FlatLeaves):  # float32 CPU tensors: one torch call copies them all
            assert torch is not None  # FlatLeaves hold torch tensors: torch is imported
            if self.t is None:
                self.t = torch.from_numpy(self.u8)
            x.copy_into(self.t[offset : offset + nbytes].view(torch.float32), self.views)
            return
        if torch is not None and isinstance(x, torch.Tensor):
            x = x.detach()
            if not x.is_cpu:
                if self.t is None:
                    self.t = torch.from_numpy(self.u8)
                self.t[offset : offset + nbytes].view(x.dtype).view(x.shape).copy_(x)
                return
            x = (x.view(torch.int16) if x.dtype is torch.bfloat16 else x).numpy()
        dst.view(x.dtype).reshape(x.shape)[...] = x


def unlink_once(seg: Segment | Control) -> None:
    """Remove the segment's name from /dev/shm (once); the mappings stay valid."""
    if seg.named:
        seg.named = False
        try:
            seg.shm.unlink()
        except FileNotFoundError:
            pass


class Control:
    """A small segment the helper writes its progress to: [last row done, errors sent]. The
    training process reads it with no system call; the errors themselves come over the pipe."""

    __slots__ = ("shm", "name", "words", "t", "named")

    def __init__(self) -> None:
        import numpy as np

        self.shm = new_shm(4096)
        self.name = self.shm.name
        self.words: Any = np.frombuffer(self.shm.buf, dtype=np.int64, count=2)
        self.words[:] = (-1, 0)
        self.named = True

    def unlink(self) -> None:
        unlink_once(self)

    def close(self) -> None:
        self.words = None
        try:
            self.shm.close()
        except BufferError:  # pragma: no cover
            pass
        self.unlink()


def shm_room() -> int:
    """The bytes of shared memory the helper may hold: MAX_BYTES, or half of what /dev/shm
    has free (a container's /dev/shm is often small; a full one would kill the process)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return MAX_BYTES
    return min(MAX_BYTES, st.f_bavail * st.f_frsize // 2)


def release_all(segments: list[Any]) -> None:
    for seg in segments:
        seg.close()
    segments.clear()
