"""`--diag` on a disk that fills up while a row is written: one line naming diag.jsonl and the
full disk, exit 2, no traceback; the file keeps the whole rows written before."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from testkit.toy_runs import sft_args
from tests.unit.diag.test_diag_recorder_writes import FullDisk
from twinrun.cli.main import run_cli


def test_a_disk_full_during_a_diag_row_is_one_line(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    def full_after_two_rows(path: Any, mode: str, buffering: int = -1) -> FullDisk:
        real = builtins.open(path, mode, buffering=buffering)
        return FullDisk(real, room=len(first_rows))

    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, tmp_path / "ok", 1, "--diag")) == 0
    first_rows = b"".join((tmp_path / "ok" / "diag.jsonl").read_bytes().splitlines(True)[:2])
    capsys.readouterr()
    monkeypatch.setattr("twinrun.diag.recorder.open", full_after_two_rows, raising=False)
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--diag")) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines == [
        f"twinrun: error: cannot write {out / 'diag.jsonl'}: No space left on device — free some "
        "space (or choose an output on another disk) and rerun"
    ], err
    assert "Traceback" not in err and "internal error" not in err
    diag = out / "diag.jsonl"
    assert diag.read_bytes() == first_rows  # left as it was: the whole rows, nothing partial
    assert [json.loads(r)["step"] for r in diag.read_text().splitlines()] == [0, 1]
