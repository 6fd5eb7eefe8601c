"""`twinrun diff` end to end: output, exit codes, --json, --report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from twinrun.cli.main import run_cli
from twinrun.diag.recorder import DiagRecorder


def write_run(path: Path, steps: int = 4, edit: dict | None = None, phase: str = "train") -> Path:
    edit = edit or {}
    with DiagRecorder(path) as rec:
        for step in range(steps):
            leaves = {
                "batch.sample_indices": torch.arange(4) + step,
                "forward.logits": torch.linspace(-1, 1, 8) * (step + 1),
                "loss": 1.0 / (step + 1),
                "grads.lora": torch.full((6,), 0.1 * (step + 1)),
            }
            for (s, leaf), v in edit.items():
                if s == step:
                    if v is None:
                        leaves.pop(leaf)
                    else:
                        leaves[leaf] = v
            rec.record(step, leaves, phase=phase)
    return path


def diff(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    rc = run_cli(["diff", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    rc, out, _ = diff(capsys, a, b)
    assert rc == 0 and out.startswith("DETERMINISTIC: 4 rows, 4 leaves compared")
    rc, out, _ = diff(capsys, a / "diag.jsonl", b / "diag.jsonl", "--bitwise")
    assert rc == 0 and out.startswith("DETERMINISTIC:") and "bitwise" in out


def test_planted_divergence_names_the_root_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a")
    edit = {(1, "batch.sample_indices"): torch.tensor([1, 2, 3, 5])}  # rel ~ 0.18
    for s in (1, 2, 3):
        edit[(s, "grads.lora")] = torch.full((6,), 5.0 * (s + 1))  # rel ~ 1
    b = write_run(tmp_path / "b", edit=edit)
    rc, out, _ = diff(capsys, a, b)
    lines = out.splitlines()
    assert rc == 1
    assert lines[0] == (
        "FIRST_DIVERGENCE: step=1 leaf=batch.sample_indices run_A=30.0 run_B=39.0 delta=9.0"
    )
    ranked = [ln.split()[0] for ln in lines if ln.startswith("    ")]
    assert ranked == ["grads.lora", "batch.sample_indices"]
    assert any(ln.startswith("advice: batch.sample_indices") for ln in lines)
    at = lines.index("3 of 4 rows diverged")
    assert lines[at + 1 :] == [
        "diverging leaves per step:",
        "  phase    step  leaves",
        "  train       1  batch.sample_indices, grads.lora",
        "  train       2  grads.lora",
        "  train       3  grads.lora",
    ]


def test_tolerance_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(2, "loss"): (1 / 3) * (1 + 1e-4)})
    assert diff(capsys, a, b)[0] == 1
    assert diff(capsys, a, b, "--rel-tol", "1e-3")[0] == 0
    assert diff(capsys, a, b, "--rel-tol", "0", "--abs-tol", "1e-3")[0] == 0


def test_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nan = float("nan")
    a = write_run(tmp_path / "a", edit={(0, "loss"): nan})
    b = write_run(tmp_path / "b", edit={(0, "loss"): nan})
    c = write_run(tmp_path / "c")
    assert diff(capsys, a, b)[0] == 0
    rc, out, _ = diff(capsys, a, c)
    assert rc == 1 and out.startswith("FIRST_DIVERGENCE: step=0 leaf=loss run_A=nan run_B=1.0")


def test_eval_phase_is_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", phase="eval")
    b = write_run(tmp_path / "b", phase="eval", edit={(3, "loss"): 0.5})
    rc, out, _ = diff(capsys, a, b)
    assert rc == 1
    assert out.splitlines()[0].endswith(" phase=eval")
    assert "step=3 leaf=loss" in out


def test_missing_row_and_leaf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a")
    rc, out, _ = diff(capsys, a, write_run(tmp_path / "short", steps=2))
    assert rc == 1 and out.startswith("FIRST_DIVERGENCE: step=2 leaf=* run_A=row run_B=missing")
    assert "run B has no row" in out and "2 of 4 rows diverged" in out
    rc, out, _ = diff(capsys, a, write_run(tmp_path / "noleaf", edit={(1, "loss"): None}))
    assert rc == 1 and out.startswith("FIRST_DIVERGENCE: step=1 leaf=loss run_A=0.25 run_B=missing")


def test_digest_only_difference(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(2, "batch.sample_indices"): torch.tensor([5, 4, 3, 2])})
    assert diff(capsys, a, b)[0] == 0
    rc, out, _ = diff(capsys, a, b, "--bitwise")
    assert rc == 1 and out.startswith("FIRST_DIVERGENCE: step=2 leaf=batch.sample_indices")
    assert "delta=0.0" in out.splitlines()[0] and "digests differ" in out


def test_malformed_line_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a")
    bad = tmp_path / "bad.jsonl"
    lines = (a / "diag.jsonl").read_text().splitlines()
    lines[3] = "{not json"
    bad.write_text("\n".join(lines) + "\n")
    rc, out, err = diff(capsys, a, bad)
    assert rc == 2 and out == ""
    assert f"{bad}:4: not valid JSON" in err
    rc, _, err = diff(capsys, a, tmp_path / "missing")
    assert rc == 2 and "missing: no such file" in err


def test_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(3, "grads.lora"): torch.zeros(6)})
    rc, out, _ = diff(capsys, a, b, "--json")
    d = json.loads(out)
    assert rc == 1 and d["deterministic"] is False and d["exit_code"] == 1
    assert d["first"]["step"] == 3 and d["first"]["leaf"] == "grads.lora"
    assert d["first"]["b"] == 0.0 and d["first"]["rel"] == 1.0
    assert d["co_diverging"][0]["leaf"] == "grads.lora"
    assert d["rows_compared"] == 4 and d["rows_diverged"] == 1 and d["leaves_compared"] == 4
    assert d["advice"]["leaf"] == "grads.lora" and "reduction order" in d["advice"]["cause"]
    rc, out, _ = diff(capsys, a, a, "--json")
    d = json.loads(out)
    assert rc == 0 and d["deterministic"] is True and d["first"] is None
    rc, out, _ = diff(capsys, a, write_run(tmp_path / "s", steps=1), "--json")
    assert json.loads(out)["first"]["delta"] == "Infinity"  # strict JSON


def test_report_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", steps=6)
    b = write_run(tmp_path / "b", steps=5, edit={(2, "loss"): 0.5, (3, "loss"): None})
    png = tmp_path / "out" / "report.png"
    rc, out, _ = diff(capsys, a, b, "--report", png)
    assert rc == 1 and png.is_file() and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in png.parent.iterdir() if p.name != "report.png"]  # no temp left
    png2 = tmp_path / "same.png"
    assert diff(capsys, a, a, "--report", png2, "--json")[0] == 0 and png2.stat().st_size > 1000


def test_subprocess_exit_codes(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", edit={(1, "loss"): 3.0})
    env = {**os.environ, "TWINRUN_DEBUG": ""}

    def run(*args: Path | str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "twinrun", "diff", *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

    assert run(a, a).returncode == 0
    p = run(a, b)
    assert p.returncode == 1 and p.stdout.startswith("FIRST_DIVERGENCE: step=1 leaf=loss")
    p = run(a, tmp_path / "nope")
    assert p.returncode == 2 and "nope" in p.stderr
