"""Capture files: never overwritten, atomic, manifest names confined to their folder, manifest
fields validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinrun.capture import manifest as mf
from twinrun.capture.store import check_free, new_dir, write_new
from twinrun.core.errors import DataError, OutputError


def test_write_new_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "optimizer_batch_step_000000.manifest.json"
    write_new(target, b"first")
    with pytest.raises(OutputError, match="already exists; a capture is never overwritten"):
        write_new(target, b"second")
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary left
    with pytest.raises(OutputError):
        check_free([tmp_path / "free", target])
    with pytest.raises(OutputError):
        new_dir(tmp_path)


def test_write_new_loses_a_race_cleanly(tmp_path: Path) -> None:
    """The existence check and the creation are one step: a file appearing between them wins."""
    target = tmp_path / "p.safetensors"

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(b"mine")
        target.write_bytes(b"theirs")  # someone else creates it meanwhile

    from twinrun.capture.store import write_new_with

    with pytest.raises(OutputError):
        write_new_with(target, write)
    assert target.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["p.safetensors"]


@pytest.mark.parametrize(
    "name", ["../x.safetensors", "/etc/passwd", "sub/x.safetensors", "..", ".", "a\\b", "", None]
)
def test_member_names_stay_in_the_folder(tmp_path: Path, name: object) -> None:
    with pytest.raises(DataError):
        mf.member(tmp_path, name, "payload")


def test_member_plain_name(tmp_path: Path) -> None:
    assert mf.member(tmp_path, "x.safetensors", "payload") == tmp_path / "x.safetensors"


def good_manifest() -> dict[str, object]:
    h = "0" * 64
    return {
        "format": mf.FORMAT, "objective": "grpo", "step": 0,
        "schedule": {"total_steps": 1, "lr": 0.1}, "payload": {"file": "p", "sha256": h},
        "logical_batch_sha256": h, "effective_rows_sha256": h, "config": {"sha256": h},
        "optimizer_contract": {"sha256": h, "values": {}},
        "initial_state": {"resume_step": -1, "adapter": {"sha256": h},
                          "adapter_config": {"sha256": h}, "trainer_state": {"sha256": h}},
    }  # fmt: skip


def test_parse_validates_fields() -> None:
    assert mf.parse(mf.dumps(good_manifest()), "m")["step"] == 0
    bad = good_manifest() | {"step": -2, "logical_batch_sha256": "xyz"}
    with pytest.raises(DataError, match=r"\['step', 'logical_batch_sha256'\]"):
        mf.parse(mf.dumps(bad), "m")
    with pytest.raises(DataError, match="not a twinrun.optimizer-batch.v1 manifest"):
        mf.parse(json.dumps({"format": "x"}).encode(), "m")
    with pytest.raises(DataError, match="not UTF-8"):
        mf.parse(b"\xff{", "m")
    for hostile, why in ((b"[" * 100_000, "nesting deeper"), (b"1" * 5000, "more than 40 digits"),
                         (b'"\\ud800"', "surrogate"), (b"{,", "not valid JSON")):  # fmt: skip
        with pytest.raises(DataError, match=why):
            mf.parse(hostile, "m")
    unpinned = good_manifest()
    del unpinned["initial_state"]["adapter_config"]  # a replay reads it: it must be pinned
    with pytest.raises(DataError, match="initial_state.adapter_config.sha256"):
        mf.parse(mf.dumps(unpinned), "m")
    late = good_manifest() | {"schedule": {"total_steps": 0, "lr": 0.1}}
    with pytest.raises(DataError, match="schedule.total_steps"):
        mf.parse(mf.dumps(late), "m")


def test_names() -> None:
    assert mf.payload_name(3) == "optimizer_batch_step_000003.safetensors"
    assert mf.manifest_name(12) == "optimizer_batch_step_000012.manifest.json"
    assert mf.state_dir_name(1) == "optimizer_batch_step_000001.state"


def test_parse_without_a_step_is_one_error() -> None:
    """Found by the hostile sweep: a manifest without `step` compared None with an int."""
    bad = good_manifest()
    del bad["step"]
    with pytest.raises(DataError, match="'step'"):
        mf.parse(mf.dumps(bad), "m")
