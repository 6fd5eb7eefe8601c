"""`DiagRecorder.record_later`: rows computed on a background thread are the bytes `record`
writes, in hand-over order; a bad row fails clearly, at hand-over or at `flush`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinrun.diag.recorder import DiagRecorder


def leaves(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "batch.sample_indices": torch.arange(step, step + 4),
        "forward.logits": [torch.randn(3, 259, generator=g), torch.randn(2, 259, generator=g)],
        "loss": torch.tensor([0.25 * step], dtype=torch.float64),
        "params.lora": [torch.randn(8, 64, generator=g) for _ in range(4)],
    }


def test_background_rows_are_the_foreground_bytes(tmp_path: Path) -> None:
    with DiagRecorder(tmp_path / "a.jsonl") as fore:
        for step in range(6):
            fore.record(step, leaves(step))
    with DiagRecorder(tmp_path / "b.jsonl") as back:
        for step in range(6):
            back.record_later(step, leaves(step))
    a, b = (tmp_path / "a.jsonl").read_bytes(), (tmp_path / "b.jsonl").read_bytes()
    assert a == b and a.count(b"\n") == 6


def test_flush_writes_every_row_handed_over(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    for step in range(3):
        rec.record_later(step, leaves(step))
    rec.flush()
    assert (tmp_path / "d.jsonl").read_text().count("\n") == 3
    rec.close()


def test_a_row_that_cannot_be_computed_fails_at_flush(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    rec.record_later(0, leaves(0))
    rec.record_later(1, {"loss": "not a number"})
    with pytest.raises((TypeError, ValueError)):
        rec.flush()
    rec.close()
    assert (tmp_path / "d.jsonl").read_text().count("\n") == 1  # the good row, nothing more


def test_a_bad_step_fails_at_hand_over_and_writes_nothing(tmp_path: Path) -> None:
    rec = DiagRecorder(tmp_path / "d.jsonl")
    with pytest.raises(ValueError, match="non-negative integer"):
        rec.record_later(-1, leaves(0))
    rec.close()
    assert not (tmp_path / "d.jsonl").exists()
