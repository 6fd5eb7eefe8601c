"""What `twinrun reproduce` says of two runs' diag files when the outputs differ: the first
divergence, or that every leaf agrees — and, for an original recorded by an older twinrun (diag
format v1, SHA256 digests), only that the checksums agree: no digest could be compared."""

from __future__ import annotations

import json
from pathlib import Path

from twinrun.dispatch.reproduce import _first_divergence


def write(run: Path, fmt: str, digest_len: int, loss: float = 0.5) -> None:
    run.mkdir(parents=True)
    rows = [
        {"format": fmt, "step": s, "phase": "train", "checksums": {"loss": loss + s},
         "digests": {"loss": f"{s:0{digest_len}x}"}}
        for s in range(2)
    ]  # fmt: skip
    (run / "diag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_older_originals_digests_are_not_called_equal(tmp_path: Path) -> None:
    write(tmp_path / "orig", "twinrun.diag.v1", 64)
    write(tmp_path / "rerun", "twinrun.diag.v2", 32)
    (line,) = _first_divergence(tmp_path / "orig", tmp_path / "rerun", [])
    assert "checksum agrees exactly" in line and "twinrun.diag.v1" in line
    assert "bit for bit" not in line


def test_one_format_says_bit_for_bit_or_the_first_divergence(tmp_path: Path) -> None:
    write(tmp_path / "a", "twinrun.diag.v2", 32)
    write(tmp_path / "b", "twinrun.diag.v2", 32)
    assert _first_divergence(tmp_path / "a", tmp_path / "b", []) == [
        "  diag.jsonl: every recorded leaf agrees bit for bit"
    ]
    write(tmp_path / "c", "twinrun.diag.v1", 64, loss=0.75)
    first, advice = _first_divergence(tmp_path / "a", tmp_path / "c", [])
    assert first.startswith("FIRST_DIVERGENCE: step=0 leaf=loss") and advice.startswith("advice:")
