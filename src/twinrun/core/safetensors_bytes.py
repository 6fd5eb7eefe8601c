"""safetensors bytes that are the same on every call, whatever the metadata.

The safetensors library (0.8) keeps the string metadata in a randomly seeded Rust `HashMap`:
with two or more metadata keys the header — and so the file's SHA256 — changes from one `save`
to the next, even with identical tensors and a dict built in sorted order. `stable_parts` lets
the library serialize, then rewrites only the header, with the metadata keys sorted. The tensor
entries keep the library's order (already the same every call) and the data is kept unchanged,
so the bytes are what the library would write had it sorted the keys (no metadata or one key:
the very same bytes); any safetensors reader loads them as before.

Nothing here touches a file: `twinrun.core.safetensors_io` is the one reader and writer
(`write_tensors` writes these bytes atomically, `tensors_bytes` returns them for hashing).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

METADATA = "__metadata__"


def stable_parts(
    tensors: Mapping[str, Any], metadata: Mapping[str, str] | None
) -> tuple[bytes, memoryview]:
    """(length prefix + header, tensor data) of `safetensors.torch.save(tensors, metadata)` with
    the metadata keys in sorted order; the data is a view on the library's bytes, not a copy."""
    from safetensors.torch import save

    data = save(dict(tensors), metadata=dict(metadata) if metadata else None)
    header, start = sorted_header(data)
    return header, memoryview(data)[start:]


def stable_save(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None) -> bytes:
    """`safetensors.torch.save(tensors, metadata=metadata)` with the metadata keys in sorted
    order (the library's own bytes object, uncopied, when that changes nothing)."""
    header, body = stable_parts(tensors, metadata)
    whole = body.obj
    if isinstance(whole, bytes) and whole[: len(header)] == header:
        return whole
    return b"".join((header, body))


def sorted_header(data: bytes | memoryview) -> tuple[bytes, int]:
    """(the length prefix and header of the safetensors file `data` with its `__metadata__` keys
    sorted — padded with spaces to a multiple of 8 bytes, as the library pads it —, where the
    tensor data starts in `data`)."""
    (n,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(bytes(data[8 : 8 + n]))
    ordered: dict[str, Any] = {}
    if METADATA in header:
        ordered[METADATA] = dict(sorted(header.pop(METADATA).items()))
    ordered.update(header)
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, 8 + n
