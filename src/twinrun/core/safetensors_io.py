"""Reading and writing safetensors files so that every failure is one line.

The safetensors library raises its own `SafetensorError` (not an OSError, not a ValueError) for a
truncated file, a flipped header byte, a header that claims gigabytes, an unknown dtype — and
also when the disk fills up under `save_file`. Every twinrun reader goes through
`read_tensors` / `read_tensors_bytes`, which turn any of those into the caller's error class
naming the file, what it is and what to do; writers go through `save_tensors_file`, which turns a
full or read-only disk into the OSError the CLI prints as its one-line disk error.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinrun.core.errors import DataError, TwinrunError

DISK_ERRORS = {
    "No space left on device": errno.ENOSPC,
    "Read-only file system": errno.EROFS,
    "Disk quota exceeded": errno.EDQUOT,
}


def reason(exc: BaseException) -> str:
    """The library's message, on one short line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _bad(path: str, what: str, exc: BaseException, hint: str, error: type[TwinrunError]) -> Any:
    return error(f"{path} is not a readable safetensors file ({what}: {reason(exc)})", hint)


def read_tensors(
    path: str | os.PathLike[str],
    what: str,
    hint: str,
    error: type[TwinrunError] = DataError,
) -> dict[str, Any]:
    """Every tensor of the safetensors file `path` (on the CPU); `error(...)` naming the file and
    `what` it is when it is missing, truncated, corrupt or not safetensors."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # SafetensorError, OSError, and torch's errors on a bad dtype
        raise _bad(str(path), what, exc, hint, error) from exc


FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
WEIGHT_SUFFIXES = (".weight", ".bias")


def check_header(
    path: str | os.PathLike[str], what: str, hint: str, error: type[TwinrunError] = DataError
) -> None:
    """Open `path` as safetensors (its header parsed and checked against the file's size)
    without reading the tensors; `error(...)` as `read_tensors` raises it. A `.weight` or
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


def read_tensors_bytes(
    data: bytes, where: str, what: str, hint: str, error: type[TwinrunError] = DataError
) -> dict[str, Any]:
    """`read_tensors` for bytes already read (and hashed) from `where`."""
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except Exception as exc:
        raise _bad(where, what, exc, hint, error) from exc


def disk_error(exc: BaseException, path: str | os.PathLike[str]) -> OSError | None:
    """The OSError a safetensors write failure stands for (a full or read-only disk), or None."""
    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    for message, code in DISK_ERRORS.items():
        if message in text:
            return OSError(code, os.strerror(code), str(path))
    return None


def save_tensors_file(
    tensors: Mapping[str, Any], path: str | os.PathLike[str], metadata: Mapping[str, str] | None
) -> None:
    """`safetensors.torch.save_file` with the metadata keys in sorted order (the same bytes on a
    rerun: `core/safetensors_bytes.py`), a full or read-only disk raised as that OSError."""
    from twinrun.core.safetensors_bytes import stable_save_file

    try:
        stable_save_file(tensors, str(Path(path)), metadata)
    except Exception as exc:
        mapped = disk_error(exc, path)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc
