"""`stable_save_file`: safetensors bytes that do not depend on the library's HashMap order."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

from twinrun.core.safetensors_bytes import sorted_header, stable_save_file

TENSORS = {"b": torch.arange(5, dtype=torch.float32), "a": torch.ones(2, 3, dtype=torch.int64),
           "c": torch.zeros(3, dtype=torch.uint8)}  # fmt: skip
METADATA = {k: f"value {i} é" for i, k in enumerate("hgfedcba")}  # eight keys, one non-ASCII


def test_the_library_alone_writes_other_bytes_on_some_call() -> None:
    # why the module exists: if this starts failing, safetensors sorts its metadata itself
    assert len({save(TENSORS, metadata=METADATA) for _ in range(20)}) > 1


def test_every_call_writes_the_same_bytes_and_they_load_unchanged(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.safetensors" for i in range(20)]
    for p in paths:
        stable_save_file(TENSORS, str(p), METADATA)
    assert len({p.read_bytes() for p in paths}) == 1
    data = paths[0].read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert n % 8 == 0 and data[8 : 8 + n].decode().startswith('{"__metadata__":{"a":"value 7 é"')
    with safe_open(str(paths[0]), framework="pt") as fh:
        assert fh.metadata() == METADATA
        assert sorted(fh.keys()) == sorted(TENSORS)
        for name, tensor in TENSORS.items():
            assert torch.equal(fh.get_tensor(name), tensor)


def test_with_one_key_the_bytes_are_the_librarys_own(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    stable_save_file(TENSORS, str(ours), {"format": "pt"})
    save_file(TENSORS, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    data = save(TENSORS)  # no metadata at all: the header is kept as it is
    header, start = sorted_header(data)
    assert header == data[:start]
