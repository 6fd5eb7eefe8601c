"""safetensors bytes that are the same on every call, whatever the metadata.

The safetensors library (0.8) keeps the string metadata in a randomly seeded Rust `HashMap`:
with two or more metadata keys the header — and so the file's SHA256 — changes from one `save`
to the next, even with identical tensors and a dict built in sorted order. `stable_save_file`
lets the library serialize, then rewrites only the header, with the metadata keys sorted. The
tensor entries keep the library's order (already the same every call) and the data is copied
unchanged, so the file is what the library would write had it sorted the keys (one key: the
very same bytes); any safetensors reader loads it as before.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

METADATA = "__metadata__"


def stable_save_file(
    tensors: Mapping[str, Any], filename: str, metadata: Mapping[str, str] | None
) -> None:
    """`safetensors.torch.save_file(tensors, filename, metadata)` with the metadata keys in
    sorted order."""
    from safetensors.torch import save

    data = memoryview(save(dict(tensors), metadata=dict(metadata) if metadata else None))
    header, start = sorted_header(data)
    with open(filename, "wb") as fh:
        fh.write(header)
        fh.write(data[start:])


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
