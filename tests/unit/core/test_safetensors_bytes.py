"""`stable_save`/`write_tensors`: safetensors bytes that do not depend on the library's HashMap
order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save, save_file

from twinrun.core.safetensors_bytes import sorted_header, stable_save
from twinrun.core.safetensors_io import tensors_bytes, write_tensors

TENSORS = {"b": torch.arange(5, dtype=torch.float32), "a": torch.ones(2, 3, dtype=torch.int64),
           "c": torch.zeros(3, dtype=torch.uint8)}  # fmt: skip
METADATA = {k: f"value {i} é" for i, k in enumerate("hgfedcba")}  # eight keys, one non-ASCII


def test_the_library_alone_writes_other_bytes_on_some_call() -> None:
    # why the module exists: if this starts failing, safetensors sorts its metadata itself
    assert len({save(TENSORS, metadata=METADATA) for _ in range(20)}) > 1


def test_every_call_writes_the_same_bytes_and_they_load_unchanged(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.safetensors" for i in range(20)]
    for p in paths:
        write_tensors(p, TENSORS, METADATA)
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
    write_tensors(ours, TENSORS, {"format": "pt"})
    save_file(TENSORS, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes() == tensors_bytes(TENSORS, {"format": "pt"})
    assert tensors_bytes(TENSORS) == save(TENSORS)
    data = save(TENSORS)  # no metadata at all: the header is kept as it is
    header, start = sorted_header(data)
    assert header == data[:start]


def test_the_bytes_and_the_file_agree(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    write_tensors(path, TENSORS, METADATA)
    assert path.read_bytes() == tensors_bytes(TENSORS, METADATA) == stable_save(TENSORS, METADATA)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "x.safetensors"]  # no temp left


def test_one_key_returns_the_librarys_own_object(monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    made: list[bytes] = []

    def save_and_keep(*args: Any, **kwargs: Any) -> bytes:
        made.append(save(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(safetensors.torch, "save", save_and_keep)
    assert stable_save(TENSORS, {"format": "pt"}) is made[-1]  # nothing copied
    assert stable_save(TENSORS, METADATA) is not made[-1]  # the header rewritten
