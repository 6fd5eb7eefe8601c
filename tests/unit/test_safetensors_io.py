"""One line for every safetensors failure: damaged files named, a full disk as the OSError."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from twinrun.core.errors import DataError, ModelError
from twinrun.core.safetensors_io import check_header, disk_error, read_tensors, read_tensors_bytes


def written(tmp_path: Path) -> Path:
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.arange(16, dtype=torch.float32)}, str(path))
    return path


def test_a_good_file_reads(tmp_path: Path) -> None:
    path = written(tmp_path)
    assert read_tensors(path, "x", "y")["w"].tolist() == list(range(16))
    check_header(path, "x", "y")


@pytest.mark.parametrize("keep", [0, 5, 40, -8])
def test_truncated_files_are_the_callers_error(tmp_path: Path, keep: int) -> None:
    path = written(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(
        ModelError, match=r"t.safetensors is not a readable safetensors file \(weights"
    ):
        read_tensors(path, "weights", "replace it", ModelError)
    with pytest.raises(DataError, match="is not a readable safetensors file"):
        read_tensors_bytes(data[:keep], str(path), "weights", "replace it")


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.safetensors is not a readable") as info:
        read_tensors(tmp_path / "nope.safetensors", "weights", "replace it")
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


def test_a_full_disk_under_save_file_is_the_os_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    from twinrun.core.safetensors_io import save_tensors_file

    def full(*_args: object, **_kwargs: object) -> None:
        raise SafetensorError(
            'Error while serializing: IoError(Os { message: "No space left on device" })'
        )

    monkeypatch.setattr(safetensors.torch, "save", full)
    with pytest.raises(OSError) as info:
        save_tensors_file({"w": torch.zeros(2)}, tmp_path / "x.safetensors", None)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(
        tmp_path / "x.safetensors"
    )


def test_integer_weights_fail_the_header_check(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"layer.weight": torch.zeros(2, dtype=torch.int32)}, str(path))
    with pytest.raises(ModelError, match="layer.weight is I32, not floating point"):
        check_header(path, "model weights", "re-save it", ModelError)
