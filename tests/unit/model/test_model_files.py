"""`model_files` / `model_sha256`: exactly the files the loader reads, framed by relative path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from twinrun.core.errors import ModelError
from twinrun.model.loading import INDEX, model_files, model_sha256


def sharded(root: Path, shards: dict[str, str]) -> Path:
    """A directory with config, tokenizer, an index naming `shards` (tensor -> file)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}')
    (root / "tokenizer.json").write_text("{}")
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    for name in set(shards.values()):
        if ".." not in name and not name.startswith("/"):
            (root / name).write_bytes(name.encode() * 4)
    return root


def test_every_shard_the_index_names_is_hashed(tmp_path: Path) -> None:
    root = sharded(tmp_path / "m", {"a": "w-1.safetensors", "b": "w-2.safetensors"})
    names = [p.name for p in model_files(root)]
    assert names == ["config.json", INDEX, "tokenizer.json", "w-1.safetensors", "w-2.safetensors"]
    before = model_sha256(root)
    (root / "w-2.safetensors").write_bytes(b"other weights")
    assert model_sha256(root) != before


def test_files_the_loader_never_reads_do_not_count(tmp_path: Path) -> None:
    root = sharded(tmp_path / "m", {"a": "w-1.safetensors"})
    before = model_sha256(root)
    (root / ".hidden.safetensors").write_bytes(b"x")
    (root / "README.md").write_text("notes")
    (root / "unused.safetensors").write_bytes(b"not in the index")
    assert model_sha256(root) == before


def test_a_copy_elsewhere_has_the_same_digest(tmp_path: Path) -> None:
    root = sharded(tmp_path / "m", {"a": "w-1.safetensors"})
    copy = tmp_path / "elsewhere" / "other-name"
    shutil.copytree(root, copy)
    assert model_sha256(copy) == model_sha256(root)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/abs.safetensors", ".h.st"])
def test_an_index_pointing_outside_is_refused(tmp_path: Path, shard: str) -> None:
    root = sharded(tmp_path / "m", {"a": shard})
    with pytest.raises(ModelError, match="names a shard outside"):
        model_sha256(root)


def test_an_index_naming_a_missing_shard_is_refused(tmp_path: Path) -> None:
    root = sharded(tmp_path / "m", {"a": "w-1.safetensors"})
    (root / "w-1.safetensors").unlink()
    with pytest.raises(ModelError, match="names a shard that is missing"):
        model_sha256(root)
