"""Plain progress lines (no terminal) carry an ETA from the mean pace so far."""

from __future__ import annotations

import pytest

from twinrun.core.progress import Progress


def test_plain_lines_carry_an_eta(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    clock = iter([100.0, 110.0, 130.0, 0.0])  # start, two updates, the quiet one's start
    monkeypatch.setattr(
        "twinrun.core.progress.time", SimpleNamespace(perf_counter=lambda: next(clock))
    )
    p = Progress(4, "sft step")
    p.update(1, "loss 1.5")  # 10 s for 1 step: 3 left
    p.update(2)  # 30 s for 2 steps: 2 left
    p.update(4)  # finished: no eta
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["sft step 1/4 loss 1.5 (eta 30 s)", "sft step 2/4 (eta 30 s)", "sft step 4/4"]
    quiet = Progress(4, "x", quiet=True)
    quiet.update(1)
    assert capsys.readouterr().err == ""
