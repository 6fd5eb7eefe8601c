"""The launcher's answer to a failed process, without starting one: the first failed process's
line when local rank 0 printed none, its exit status, and one line for a process a signal
ended. And what a launched process does with its error line."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from twinrun.train.parallel.launcher import LINES_ENV, LaunchError, _failed, hand_over


def failure(local_rank: int, exitcode: int, timestamp: int) -> ProcessFailure:
    f = ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode,
                       error_file="<N/A>")  # fmt: skip
    f.timestamp = timestamp
    return f


def test_rank_1_s_line_is_printed_when_rank_0_printed_none(tmp_path: Path) -> None:
    (tmp_path / "rank-1.line").write_text("twinrun: error: --device cuda:1 asked for but …\n")
    exc = ChildFailedError("twinrun", {1: failure(1, 2, 1), 0: failure(0, -15, 2)})
    assert _failed(exc, tmp_path) == (2, "twinrun: error: --device cuda:1 asked for but …")


def test_nothing_more_is_printed_when_rank_0_printed_its_line(tmp_path: Path) -> None:
    (tmp_path / "rank-1.line").write_text("twinrun: error: the same line\n")
    exc = ChildFailedError("twinrun", {1: failure(1, 2, 1), 0: failure(0, 2, 2)})
    assert _failed(exc, tmp_path) == (2, None)


def test_a_process_a_signal_ended_is_named_in_one_line(tmp_path: Path) -> None:
    exc = ChildFailedError("twinrun", {0: failure(0, -int(signal.SIGKILL), 1)})
    with pytest.raises(LaunchError, match=r"^rank 0 \(pid 1000\) was ended by SIGKILL") as info:
        _failed(exc, tmp_path)
    assert info.value.exit_code == 128 + int(signal.SIGKILL)


def test_a_launched_process_hands_its_line_over_unless_it_is_local_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LINES_ENV, raising=False)
    monkeypatch.setenv("RANK", "3")
    assert not hand_over("twinrun: error: x")  # not launched by twinrun launch: it prints
    monkeypatch.setenv(LINES_ENV, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert hand_over("twinrun: error: x")
    assert (tmp_path / "rank-3.line").read_text() == "twinrun: error: x\n"
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not hand_over("twinrun: error: y")  # local rank 0 prints, and keeps a copy
    assert (tmp_path / "rank-3.line").read_text() == "twinrun: error: y\n"
