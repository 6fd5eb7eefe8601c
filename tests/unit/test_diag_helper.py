"""`DiagRecorder.record_later` through the helper process: the rows are the bytes `record`
writes for every kind of leaf, in hand-over order; errors come back as the same exceptions; a
dead helper is a clear error, never a hang; no shared-memory segment outlives the recorder;
where no helper can run, the recorder's thread takes the rows."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from twinrun.core.errors import OutputError
from twinrun.diag import helper
from twinrun.diag.recorder import DiagRecorder, LeafValue
from twinrun.train.hooks.diag import copied


def segments() -> set[str]:
    """This process's twinrun segments in /dev/shm."""
    prefix = f"twinrun_diag_{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def mixed(step: int, copy: bool = True) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    lora = [[torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g)] for _ in range(3)]
    params = [torch.nn.Parameter(torch.randn(8, 8, generator=g))]
    flat = copied([*lora, params, [t.double() for t in lora[0]]], copy)
    return {
        "float32": torch.randn(3, 5, generator=g),
        "bfloat16": torch.randn(4, 7, generator=g).bfloat16(),
        "float64": torch.randn(3, generator=g, dtype=torch.float64),
        "float64.large": torch.randn(100, generator=g, dtype=torch.float64),
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
        "uint32": torch.arange(5).to(torch.uint32),  # numpy-less dtype path: computed here
        "lora.a": flat[0],
        "lora.b": flat[1],
        "lora.c": flat[2],
        "lora.params": flat[3],
        "float64.parts": flat[4],
        "numpy.f32": np.arange(6, dtype=np.float32).reshape(2, 3) * step,
        "numpy.big_endian": np.arange(4, dtype=">f4"),
        "numpy.f64": np.linspace(0, 1, 200),
        "float": 0.125 * step,
        "int": step,
        "bool.py": True,
        "list": [1.5, 2.5, step],
        "list.empty": [],
        "nan": float("nan"),
        "precomputed": LeafValue(1.0, "ab"),
    }


def test_helper_rows_are_the_bytes_record_writes(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        for step in range(4):
            fore.record(step, mixed(step))
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        back.start_background()
        for step in range(4):
            back.record_later(step, mixed(step, copy=not back.copies_at_hand_over()))
        assert back.background == "process"
    a, b = (tmp_path / "a.jsonl").read_bytes(), (tmp_path / "b.jsonl").read_bytes()
    assert a == b and a.count(b"\n") == 4
    assert not segments()


def test_a_row_larger_than_the_buffer_grows_it(tmp_path: Path) -> None:
    big = {"params": [torch.randn(700_000), torch.randn(300, 1000).bfloat16()], "x": 1.0}
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        fore.record(0, big)
        fore.record(1, {"x": 2.0})
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        back.record_later(0, big)
        back.record_later(1, {"x": 2.0})
        assert back.background == "process"
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_the_copies_are_taken_at_the_hand_over(tmp_path: Path) -> None:
    t = torch.ones(4)
    lora = [[torch.ones(8, 8), torch.ones(8, 2)]]
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        fore.record(0, {"t": t.clone(), "lora": copied(lora)[0]})
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        assert back.copies_at_hand_over()
        back.record_later(0, {"t": t, "lora": copied(lora, copy=False)[0]})
        t.mul_(3.0)  # the next step's in-place updates do not reach the row
        lora[0][0].mul_(3.0)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_record_after_record_later_keeps_the_order(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "d.jsonl") as rec:
        rec.record_later(0, {"loss": torch.tensor([0.5], dtype=torch.float64)})
        rec.record(0, {"loss": 1.0}, phase="eval")
        rec.record_later(1, {"loss": torch.tensor([0.25], dtype=torch.float64)})
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert ['"phase": "eval"' in line for line in lines] == [False, True, False]
    assert ['"step": 1' in line for line in lines] == [False, False, True]


def test_errors_come_back_as_the_same_exceptions(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, {"loss": 1.0})
    rec.record_later(1, {"loss": "not a number"})  # fails in the helper
    rec.record_later(2, {"loss": 2.0})
    with pytest.raises(TypeError):
        rec.flush()
    rec.record_later(3, {"loss": torch.randn(2, dtype=torch.complex64)})  # fails here
    with pytest.raises(TypeError, match="complex64"):
        rec.flush()
    rec.flush()  # raised once
    rec.close()
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert ['"step": 0' in lines[0], '"step": 2' in lines[1], len(lines)] == [True, True, 2]
    assert not segments()


def test_a_killed_helper_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, {"loss": 1.0})
    rec.flush()
    assert rec._helper is not None
    pid = rec._helper.proc.pid
    os.kill(pid, signal.SIGKILL)
    t0 = time.perf_counter()
    with pytest.raises(OutputError, match=rf"pid {pid}\) was killed by signal 9"):
        rec.record_later(1, {"loss": 2.0})
        rec.flush()
    with pytest.raises(OutputError):  # the recorder stays broken: no row is silently lost
        rec.record_later(2, {"loss": 3.0})
    rec.close()  # reported already: close does not raise it again
    assert time.perf_counter() - t0 < 10
    assert (tmp_path / "d.jsonl").read_text().count("\n") == 1
    assert not segments()


def test_a_helper_killed_with_rows_in_flight_names_their_steps(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, {"loss": 1.0})
    rec.flush()
    assert rec._helper is not None
    rec._helper.proc.send_signal(signal.SIGSTOP)  # rows stay in flight
    for step in (1, 2, 3):
        rec.record_later(step, {"loss": torch.randn(1000)})
    os.kill(rec._helper.proc.pid, signal.SIGKILL)
    with pytest.raises(OutputError, match=r"before it wrote the rows of steps 1\.\.3"):
        rec.flush()
    rec.close()
    assert not segments()


def test_no_segment_outlives_a_run_that_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the run failed"), DiagRecorder(tmp_path) as rec:
        for step in range(3):
            rec.record_later(step, {"params": [torch.randn(64, 64)], "loss": 0.5})
        assert rec.background == "process"
        raise RuntimeError("the run failed")
    assert not segments()
    assert (tmp_path / "diag.jsonl").read_text().count("\n") == 3


def test_an_unclosed_recorder_releases_its_segments(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, {"params": [torch.randn(64, 64)]})
    rec.flush()
    assert rec._helper is not None
    proc = rec._helper.proc
    del rec
    import gc

    gc.collect()
    assert not segments()
    assert proc.wait(10) is not None


@pytest.mark.parametrize("how", ["env", "unavailable", "exits"])
def test_without_a_helper_the_thread_takes_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "env":
        monkeypatch.setenv(helper.ENV, "0")
    elif how == "unavailable":

        def unavailable(*args: object, **kwargs: object) -> None:
            raise helper.HelperUnavailable("no shared memory")

        monkeypatch.setattr("twinrun.diag.recorder.RowHelper", unavailable)
    else:
        monkeypatch.setattr(helper, "_BOOT", "import sys; sys.exit(3)")
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        for step in range(2):
            fore.record(step, mixed(step))
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        assert not back.copies_at_hand_over()
        for step in range(2):
            back.record_later(step, mixed(step))
        assert back.background == "thread"
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert not segments()
