"""`DiagRecorder.record_later`: the row is computed and written before the call returns (the
bytes `record` writes for every kind of leaf, in call order); a bad row fails at once and
writes nothing; a failed write (a full disk) is one OutputError naming the file, and the file
keeps whole rows only."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from twinrun.core.errors import OutputError
from twinrun.diag.recorder import DiagRecorder, LeafValue
from twinrun.train.hooks.diag import copied


def leaves(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "batch.sample_indices": torch.arange(step, step + 4),
        "forward.logits": [torch.randn(3, 259, generator=g), torch.randn(2, 259, generator=g)],
        "loss": torch.tensor([0.25 * step], dtype=torch.float64),
        "params.lora": [torch.randn(8, 64, generator=g) for _ in range(4)],
    }


def mixed(step: int, copy: bool = True) -> dict[str, object]:
    """Every kind of leaf value a row may hold."""
    g = torch.Generator().manual_seed(step)
    lora = [[torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g)] for _ in range(3)]
    params = [torch.nn.Parameter(torch.randn(8, 8, generator=g))]
    flat = copied([*lora, params, [t.double() for t in lora[0]]], copy)
    return {
        "float32": torch.randn(3, 5, generator=g),
        "bfloat16": torch.randn(4, 7, generator=g).bfloat16(),
        "float64": torch.randn(3, generator=g, dtype=torch.float64),
        "float16": torch.randn(6, generator=g).half(),
        "int64": torch.arange(step, step + 9),
        "bool": torch.tensor([True, False, step % 2 == 0]),
        "rng.state": [torch.get_rng_state()],
        "scalar.0d": torch.tensor(2.5 + step),
        "empty": torch.empty(0, 3),
        "strided": torch.randn(6, 4, generator=g).t(),
        "requires_grad": torch.randn(3, generator=g, requires_grad=True),
        "parts": [torch.randn(3, 259, generator=g), torch.randn(2, 259, generator=g)],
        "parts.mixed": [torch.randn(3, generator=g).bfloat16(), torch.arange(4)],
        "uint32": torch.arange(5).to(torch.uint32),
        "lora.a": flat[0],
        "lora.b": flat[1],
        "lora.c": flat[2],
        "lora.params": flat[3],
        "float64.parts": flat[4],
        "numpy.f32": np.arange(6, dtype=np.float32).reshape(2, 3) * step,
        "numpy.big_endian": np.arange(4, dtype=">f4"),
        "float": 0.125 * step,
        "int": step,
        "list": [1.5, 2.5, step],
        "nan": float("nan"),
        "precomputed": LeafValue(1.0, "ab"),
    }


def test_record_later_rows_are_the_bytes_record_writes(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        for step in range(6):
            fore.record(step, leaves(step))
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        for step in range(6):
            back.record_later(step, leaves(step))
    a, b = (tmp_path / "a.jsonl").read_bytes(), (tmp_path / "b.jsonl").read_bytes()
    assert a == b and a.count(b"\n") == 6


def test_every_kind_of_leaf_and_uncopied_groups_give_the_same_bytes(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        for step in range(3):
            fore.record(step, mixed(step))  # copied groups
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        for step in range(3):
            back.record_later(step, mixed(step, copy=False))  # the live tensors, grouped
    a, b = (tmp_path / "a.jsonl").read_bytes(), (tmp_path / "b.jsonl").read_bytes()
    assert a == b and a.count(b"\n") == 3


def test_the_row_is_on_disk_when_record_later_returns(tmp_path: Path) -> None:
    t = torch.ones(4)
    lora = [[torch.ones(8, 8), torch.ones(8, 2)]]
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        fore.record(0, {"t": t.clone(), "lora": copied(lora)[0]})
    back = DiagRecorder(tmp_path / "b.jsonl")
    back.record_later(0, {"t": t, "lora": copied(lora, copy=False)[0]})
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()  # no flush
    t.mul_(3.0)  # the next step's in-place updates: the row has its bytes already
    lora[0][0].mul_(3.0)
    back.flush()
    back.close()
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()


def test_record_and_record_later_keep_the_call_order(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "d.jsonl") as rec:
        rec.record_later(0, {"loss": torch.tensor([0.5], dtype=torch.float64)})
        rec.record(0, {"loss": 1.0}, phase="eval")
        rec.record_later(1, {"loss": torch.tensor([0.25], dtype=torch.float64)})
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [(r["step"], r["phase"]) for r in rows] == [(0, "train"), (0, "eval"), (1, "train")]


def test_a_row_that_cannot_be_computed_fails_at_once_and_writes_nothing(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, leaves(0))
    with pytest.raises((TypeError, ValueError)):
        rec.record_later(1, {"loss": "not a number"})
    with pytest.raises(TypeError, match="complex64"):
        rec.record_later(2, {"loss": torch.randn(2, dtype=torch.complex64)})
    rec.record_later(3, leaves(3))
    rec.flush()
    rec.close()
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 3]  # the good rows, whole, nothing more


def test_a_bad_step_fails_at_hand_over_and_writes_nothing(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    with pytest.raises(ValueError, match="non-negative integer"):
        rec.record_later(-1, leaves(0))
    rec.close()
    assert not (tmp_path / "d.jsonl").exists()


@pytest.mark.parametrize("append", [False, True])
def test_a_fresh_log_is_truncated_at_the_first_row_and_a_resumed_one_kept(
    tmp_path: Path, append: bool
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"old row\n")
    rec = DiagRecorder(path, append=append, fsync=True)
    assert path.read_bytes() == b"old row\n"  # nothing is touched before a row
    rec.record(0, {"loss": 1.0})
    rec.close()
    with DiagRecorder(tmp_path / "want.jsonl") as want:
        want.record(0, {"loss": 1.0})
    row = (tmp_path / "want.jsonl").read_bytes()
    assert path.read_bytes() == (b"old row\n" + row if append else row)


class FullDisk:
    """A file whose writes run out of space after `room` bytes (the OS takes part of a write,
    then refuses the rest, as a full disk does)."""

    def __init__(self, real: Any, room: int) -> None:
        self.real, self.room = real, room

    def write(self, data: memoryview) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self.real.write(data[: self.room])
        self.room -= n
        return int(n)

    def fileno(self) -> int:
        return int(self.real.fileno())

    def truncate(self, size: int) -> int:
        return int(self.real.truncate(size))

    def close(self) -> None:
        self.real.close()


def test_a_full_disk_is_one_output_error_and_the_file_keeps_whole_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    rec = DiagRecorder(path)
    rec.record_later(0, leaves(0))
    first = path.read_bytes()
    rec._fh = FullDisk(rec._fh, room=100)  # part of the next row fits, the rest does not
    with pytest.raises(OutputError) as info:
        rec.record_later(1, leaves(1))
    line = info.value.one_line()
    assert line == (
        f"cannot write {path}: No space left on device — free some space (or choose an output "
        "on another disk) and rerun"
    )
    assert "\n" not in line
    assert path.read_bytes() == first  # the partial row is cut off again
    rec._fh.room = 10**9  # space freed: the next row follows the whole ones
    rec.record_later(2, leaves(2))
    rec.close()  # nothing buffered: closing cannot fail again
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2]


def test_a_full_device_is_one_output_error(tmp_path: Path) -> None:
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here")
    rec = DiagRecorder(full, append=True)  # a character device cannot be truncated
    with pytest.raises(OutputError, match=r"^cannot write /dev/full: No space left on device$"):
        rec.record(0, {"loss": 1.0})
    rec.close()


def test_a_directory_that_cannot_be_made_is_one_output_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    rec = DiagRecorder(tmp_path / "f" / "run" / "diag.jsonl")
    with pytest.raises(OutputError, match="cannot write .*diag.jsonl: Not a directory"):
        rec.record(0, {"loss": 1.0})
    rec.close()
