"""The one reader and writer: every failure one line, damaged files named, a full disk as the
one-line OutputError naming the path, the old file kept."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from twinrun.core import safetensors_io
from twinrun.core.errors import DataError, ModelError, OutputError
from twinrun.core.safetensors_io import (
    check_header,
    disk_error,
    read_safetensors,
    tensors_bytes,
    write_tensors,
)


def written(tmp_path: Path) -> Path:
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.arange(16, dtype=torch.float32)}, str(path))
    return path


def test_a_good_file_reads(tmp_path: Path) -> None:
    path = written(tmp_path)
    assert read_safetensors(path, "x", "y").tensors["w"].tolist() == list(range(16))
    check_header(path, "x", "y")


@pytest.mark.parametrize("keep", [0, 5, 40, -8])
def test_truncated_files_are_the_callers_error(tmp_path: Path, keep: int) -> None:
    path = written(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(
        ModelError, match=r"t.safetensors is not a readable safetensors file \(weights"
    ):
        read_safetensors(path, "weights", "replace it", ModelError)
    with pytest.raises(DataError, match="is not a readable safetensors file"):
        read_safetensors(data[:keep], "weights", "replace it", where=str(path))


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.safetensors is not a readable") as info:
        read_safetensors(tmp_path / "nope.safetensors", "weights", "replace it")
    assert "\n" not in info.value.one_line() and info.value.hint == "replace it"


@pytest.mark.parametrize(
    ("message", "code"),
    [("No space left on device", errno.ENOSPC), ("Read-only file system", errno.EROFS)],
)
def test_disk_errors_inside_safetensors_errors_are_os_errors(message: str, code: int) -> None:
    exc = SafetensorError(f'Error while serializing: IoError(Os {{ message: "{message}" }})')
    mapped = disk_error(exc, "/out/x.safetensors")
    assert isinstance(mapped, OSError) and mapped.errno == code
    assert mapped.filename == "/out/x.safetensors"
    assert disk_error(SafetensorError("HeaderTooLarge"), "p") is None


def test_a_full_disk_is_one_line_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.safetensors"
    write_tensors(path, {"w": torch.zeros(2)}, {"format": "pt"})
    before = path.read_bytes()

    class Full:
        def __init__(self, *_args: object) -> None:
            pass

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *_args: object) -> None:
            pass

        def write(self, _data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors_io, "open", Full, raising=False)
    with pytest.raises(OutputError, match=r"cannot write .*x.safetensors: No space left") as info:
        write_tensors(path, {"w": torch.ones(2)}, {"format": "pt"})
    assert isinstance(info.value, OSError) and "\n" not in info.value.one_line()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]  # no temporary left


def test_metadata_and_tensors_read_alike_from_a_file_and_from_bytes(tmp_path: Path) -> None:
    tensors = {"b": torch.arange(3, dtype=torch.int64), "a": torch.ones(2, 2)}
    metadata = {"z": "1", "a": "é"}
    path = tmp_path / "m.safetensors"
    write_tensors(path, tensors, metadata)
    for source in (
        path,
        str(path),
        path.read_bytes(),
        memoryview(tensors_bytes(tensors, metadata)),
    ):
        got = read_safetensors(source, "x", "y", where="m")
        from_path = read_safetensors(path, "x", "y").tensors
        assert got.metadata == metadata and list(got.tensors) == list(from_path)
        assert all(torch.equal(got.tensors[k], v) for k, v in tensors.items())
    assert read_safetensors(tensors_bytes(tensors), "x", "y").metadata == {}


def test_integer_weights_fail_the_header_check(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"layer.weight": torch.zeros(2, dtype=torch.int32)}, str(path))
    with pytest.raises(ModelError, match="layer.weight is I32, not floating point"):
        check_header(path, "model weights", "re-save it", ModelError)
