"""The one way twinrun reads and the one way it writes safetensors, every failure one line.

Reading: `read_safetensors(source, what, hint, error)` — every tensor (on the CPU) of a file, or
of bytes already read and hashed (`where` names where they came from), and its `__metadata__`
strings. `check_header` opens a file and checks its header without reading
the tensors (a base model's shards, gigabytes, before transformers loads them). The safetensors
library raises its own `SafetensorError` (not an OSError, not a ValueError) for a truncated file,
a flipped header byte, a header that claims gigabytes, an unknown dtype: each becomes the
caller's error class naming the file, what it is and what to do.

Writing: `write_tensors(path, tensors, metadata)` writes the file atomically (a temporary name
in the same directory, fsync, rename, directory fsync: `core.fileio.atomic_write_with`), a full
or read-only disk raised as the one-line `OutputError` (an OSError) naming the path;
`tensors_bytes(tensors, metadata)` is the same bytes in memory, for a file whose SHA256 is
recorded before it is written (a capture's payload and state). Both serialize through
`core.safetensors_bytes`: the library's bytes with the metadata keys sorted, the tensors in the
library's order, so identical tensors and metadata give identical bytes on every call.

Reading part of a file: `read_header(path, ...)` gives the header's bytes and each tensor's
dtype, shape and absolute byte span from the header alone (`tensor_spans`: the spans), the spans
held to tile the data section as the library holds them (`tiling_problem`, which the capture
reader applies too), and `read_span(path, offset, out)` reads exactly those bytes of
the file into `out` (a writable buffer): what a process of a sharded base reads of its rows
(`model/shards.py`), and the one place such reads happen (tests wrap it to see every range).

Not here: a capture payload is decoded by `capture.tensorfile` (zero-copy views on the verified
bytes), and a Hugging Face checkpoint is written by transformers' `save_pretrained`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from twinrun.core.errors import DataError, TwinrunError, write_failed

DISK_ERRORS = {
    "No space left on device": errno.ENOSPC,
    "Read-only file system": errno.EROFS,
    "Disk quota exceeded": errno.EDQUOT,
    "File too large": errno.EFBIG,  # a file-size limit (RLIMIT_FSIZE, `ulimit -f`)
}
Source = str | os.PathLike[str] | bytes | bytearray | memoryview


def reason(exc: BaseException) -> str:
    """The library's message, on one short line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _bad(path: str, what: str, exc: BaseException, hint: str, error: type[TwinrunError]) -> Any:
    return error(f"{path} is not a readable safetensors file ({what}: {reason(exc)})", hint)


class SafetensorsFile(NamedTuple):
    tensors: dict[str, Any]  # name -> CPU torch tensor, in the file's order (see `_in_file_order`)
    metadata: dict[str, str]  # the header's `__metadata__` ({} when it has none)


def _in_file_order(prefix: bytes, tensors: dict[str, Any]) -> SafetensorsFile:
    """`tensors` ordered by their byte spans in the file, then by name, and the metadata, from
    `prefix` (the file's length prefix and header, already checked by the library). The library
    orders neither alike: `load` (bytes) in its HashMap's random order, `safe_open` by span with
    ties (empty tensors) in that random order."""
    (n,) = struct.unpack("<Q", prefix[:8])
    header = json.loads(prefix[8 : 8 + n])
    metadata = header.pop("__metadata__", None) or {}
    order = sorted(header, key=lambda name: (*header[name]["data_offsets"], name))
    return SafetensorsFile({name: tensors[name] for name in order}, dict(metadata))


def read_safetensors(
    source: Source,
    what: str,
    hint: str,
    error: type[TwinrunError] = DataError,
    *,
    where: str | None = None,
) -> SafetensorsFile:
    """The tensors (on the CPU) and metadata of the safetensors file `source` — a path, or the
    bytes already read (and hashed) from `where` —; `error(...)` naming the file and `what` it is
    when it is missing, truncated, corrupt or not safetensors."""
    from safetensors import safe_open
    from safetensors.torch import load

    in_memory = isinstance(source, bytes | bytearray | memoryview)
    name = (where or "safetensors bytes") if in_memory else str(source)
    try:
        if isinstance(source, bytes | bytearray | memoryview):  # (`in_memory`, for mypy)
            data = bytes(source)
            return _in_file_order(data, load(data))
        with safe_open(str(source), framework="pt", device="cpu") as fh:
            tensors = fh.get_tensors()  # what safetensors.torch.load_file returns
        with open(source, "rb") as raw:
            prefix = raw.read(8)
            prefix += raw.read(struct.unpack("<Q", prefix)[0])
        return _in_file_order(prefix, tensors)
    except Exception as exc:  # SafetensorError, OSError, and torch's errors on a bad dtype
        raise _bad(name, what, exc, hint, error) from exc


class TensorSpan(NamedTuple):
    dtype: str  # the header's dtype ("F32", "BF16", ...)
    shape: tuple[int, ...]
    offset: int  # the first byte of the tensor's data in the file
    length: int  # its bytes


ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
    "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
MAX_HEADER = 100 * 2**20


class Header(NamedTuple):
    prefix: bytes  # the file's first bytes: the 8-byte length, then the JSON header
    spans: dict[str, TensorSpan]  # each tensor's dtype, shape and absolute byte span


def tiling_problem(spans: list[tuple[int, int]], body: int) -> str | None:
    """What is wrong with tensor byte spans [begin, end) that must tile a data section of `body`
    bytes exactly — no gap, no overlap, nothing after the last — as the safetensors library
    demands of a file it opens (the one-process loader); None when they do."""
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            return "tensor byte spans leave a gap or overlap"
        position = end
    return "bytes after the last tensor" if position != body else None


def read_header(
    path: str | os.PathLike[str], what: str, hint: str, error: type[TwinrunError] = DataError
) -> Header:
    """The header of `path` (its bytes, and each tensor's span), read alone: no memory map (the
    library maps the whole file, which a capped process may not be allowed to), nothing past
    the header read. `error(...)` as `read_safetensors` raises it for a header that is cut
    short, not JSON, or whose spans do not fit their shapes or do not tile the data section
    (`tiling_problem`: a tensor's bytes set onto another's); a `.weight` or `.bias` tensor must
    be floating point (as `check_header`)."""
    try:
        with open(path, "rb") as raw:
            size = os.fstat(raw.fileno()).st_size
            prefix = raw.read(8)
            if len(prefix) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", prefix)
            if n > min(size - 8, MAX_HEADER):
                raise ValueError("header length runs past the end of the file")
            prefix += raw.read(n)
        header = json.loads(prefix[8:])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        header.pop("__metadata__", None)
        start = 8 + n
        spans = {}
        for name, info in header.items():
            itemsize = ITEMSIZE[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
            if min(shape, default=0) < 0 or not 0 <= begin <= end <= size - start:
                raise ValueError(f"tensor {name!r}: bad shape or byte span")
            if end - begin != math.prod(shape) * itemsize:
                raise ValueError(f"tensor {name!r}: shape {list(shape)} does not fill its span")
            spans[name] = TensorSpan(str(info["dtype"]), shape, start + begin, end - begin)
        ranges = [(s.offset - start, s.offset - start + s.length) for s in spans.values()]
        problem = tiling_problem(ranges, size - start)
        if problem is not None:
            raise ValueError(problem)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _bad(str(path), what, exc, hint, error) from exc
    for name, span in sorted(spans.items()):
        if name.endswith(WEIGHT_SUFFIXES) and span.dtype not in FLOAT_DTYPES:
            raise error(f"{path}: {what} {name} is {span.dtype}, not floating point", hint)
    return Header(prefix, spans)


def tensor_spans(
    path: str | os.PathLike[str], what: str, hint: str, error: type[TwinrunError] = DataError
) -> dict[str, TensorSpan]:
    """Each tensor's dtype, shape and absolute byte span in `path`, from its header alone
    (`read_header`, every check included)."""
    return read_header(path, what, hint, error).spans


def read_span(path: str | os.PathLike[str], offset: int, out: memoryview) -> None:
    """Read exactly `len(out)` bytes of `path` from `offset` into `out` (OSError when the file
    ends first)."""
    view = out.cast("B") if out.format != "B" or out.ndim != 1 else out
    done = 0
    with open(path, "rb", buffering=0) as fh:
        while done < len(view):
            got = os.preadv(fh.fileno(), [view[done:]], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"{path} ends before byte {offset + len(view)}")
            done += got


FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
WEIGHT_SUFFIXES = (".weight", ".bias")


def check_header(
    path: str | os.PathLike[str], what: str, hint: str, error: type[TwinrunError] = DataError
) -> None:
    """Open `path` as safetensors (its header parsed and checked against the file's size)
    without reading the tensors; `error(...)` as `read_safetensors` raises it. A `.weight` or
    `.bias` tensor must be floating point: transformers would cast an integer one silently."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            dtypes = {name: fh.get_slice(name).get_dtype() for name in fh.keys()}
    except Exception as exc:
        raise _bad(str(path), what, exc, hint, error) from exc
    for name, dtype in sorted(dtypes.items()):
        if name.endswith(WEIGHT_SUFFIXES) and dtype not in FLOAT_DTYPES:
            raise error(f"{path}: {what} {name} is {dtype}, not floating point", hint)


def tensors_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """The bytes `write_tensors(path, tensors, metadata)` writes."""
    from twinrun.core.safetensors_bytes import stable_save

    return stable_save(tensors, metadata)


def write_tensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, Any],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write `tensors` (contiguous CPU tensors) and the string `metadata` to `path` atomically:
    the old file or the whole new one, never half of one; OutputError on a full, read-only or
    missing location."""
    from twinrun.core.fileio import atomic_write_with
    from twinrun.core.safetensors_bytes import stable_parts

    header, body = stable_parts(tensors, metadata)  # a bad tensor is a bug: raised as it is

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(header)
            fh.write(body)

    atomic_write_with(path, write)


@contextlib.contextmanager
def library_writes(path: str | os.PathLike[str]) -> Iterator[None]:
    """A library's own writes into `path` (transformers' `save_pretrained`): a full or
    read-only disk, or a file-size limit, however the library words it, as the one line of
    `write_failed` naming `path`; anything else as it was raised."""
    try:
        yield
    except TwinrunError:
        raise
    except Exception as exc:
        disk = disk_error(exc, path)
        if disk is None or disk.errno not in DISK_ERRORS.values():
            raise
        raise write_failed(path, disk) from exc


def disk_error(exc: BaseException, path: str | os.PathLike[str]) -> OSError | None:
    """The OSError a safetensors write failure stands for (a full or read-only disk), or None:
    for what the library writes itself (transformers' `save_pretrained`)."""
    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    for message, code in DISK_ERRORS.items():
        if message in text:
            return OSError(code, os.strerror(code), str(path))
    return None
