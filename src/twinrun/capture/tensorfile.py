"""A strict, zero-copy reader of safetensors bytes (the format: an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte span, then the data).

The one reader besides `twinrun.core.safetensors_io.read_safetensors`, and why it stays: a payload
is decoded from exactly the bytes whose SHA256 was just checked — read once, never reopened —
and the library (`safetensors.torch.load`, what `read_safetensors` uses on bytes) copies every
tensor out of them, which for a large payload costs as much as hashing it again. Here each
tensor is a read-only numpy view on those bytes. The reader is also stricter than the library:
only the dtypes a capture uses, shapes that match their spans, and spans that tile the data
exactly (no gaps, no overlaps, nothing after); `header` gives the metadata of bytes without
decoding a tensor. Payloads are written by `core.safetensors_io.tensors_bytes` (the library's
bytes); tests check both readers agree.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import Limits, parse_json
from twinrun.core.safetensors_io import tiling_problem

DTYPES: dict[str, np.dtype] = {"I64": np.dtype("<i8"), "F64": np.dtype("<f8"), "U8": np.dtype("u1"),
          "F32": np.dtype("<f4")}  # fmt: skip
MAX_HEADER = 100 * 2**20


def header(data: bytes | memoryview) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and where the data starts."""
    if len(data) < 8:
        raise DataError("shorter than a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, MAX_HEADER):
        raise DataError("safetensors header length runs past the end of the file")
    header_limits = Limits(max_bytes=MAX_HEADER, max_file_bytes=MAX_HEADER)
    parsed = parse_json(bytes(data[8 : 8 + n]), "safetensors header", header_limits)
    if not isinstance(parsed, dict):
        raise DataError("safetensors header is not a JSON object")
    return parsed, 8 + n


def read(data: bytes | memoryview) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors as read-only numpy views on `data`, metadata)."""
    parsed, start = header(data)
    meta = parsed.pop("__metadata__", None) or {}
    body = len(data) - start
    tensors: dict[str, np.ndarray] = {}
    spans = []
    for name, info in parsed.items():
        try:
            dtype = DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"tensor {name!r}: unsupported or malformed entry") from exc
        count = math.prod(shape)
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= body:
            raise DataError(f"tensor {name!r}: bad shape or byte span")
        if end - begin != count * dtype.itemsize:
            raise DataError(f"tensor {name!r}: shape {shape} does not fill its byte span")
        spans.append((begin, end))
        view = np.frombuffer(data, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = view.reshape(shape)
    problem = tiling_problem(spans, body)
    if problem is not None:
        raise DataError(problem)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise DataError("safetensors metadata must map strings to strings")
    return tensors, meta
