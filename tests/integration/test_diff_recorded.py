"""`twinrun diff` names what the runs' sidecars record differently before its guess from the
leaf: hand-written run directories (the pinned drifting pair with sidecars beside it), and real
toy runs at --threads 1 and 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from testkit.toy_runs import run_args, write_examples
from tests.integration.diff_cases import drifting
from twinrun.cli.main import run_cli

SIDECAR: dict[str, Any] = {
    "format": "twinrun.run.v1",
    "train": {"objective": "sft", "seed": 1, "threads": 1, "precision": "f32"},
    "model": {"sha256": "a" * 64},
    "data": {"sha256": "d" * 64},
    "adapter": {"sha256": "e" * 64},
    "determinism": {"strict": True, "threads": 1, "device": "cpu", "torch": "2.13.0+cpu",
                    "cpu_kernels": {"mode": "portable", "aten_capability": "AVX2"}},
    "runtime": {"python": "3.11.7", "torch": "2.13.0+cpu"},
    "metrics": {"final_loss": 1.5, "wall_s": 0.25},
    "inputs": {"model": "runs/toy", "examples": "ex.jsonl"},
}  # fmt: skip


def diff(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    rc = run_cli(["diff", *map(str, args)])
    return rc, capsys.readouterr().out


def drift_runs(root: Path, sidecar_b: dict[str, Any]) -> tuple[Path, Path]:
    """Run directories holding the pinned drifting pair (grads.lora parts at step 10), run A
    with SIDECAR and run B with `sidecar_b`."""
    drifting(root)
    runs = []
    for name, source, record in (("A", "a.jsonl", SIDECAR), ("B", "drift.jsonl", sidecar_b)):
        run = root / f"run-{name}"
        run.mkdir()
        (run / "diag.jsonl").write_bytes((root / source).read_bytes())
        (run / "twinrun.json").write_text(json.dumps(record))
        runs.append(run)
    return runs[0], runs[1]


def with_threads(n: int) -> dict[str, Any]:
    out = copy.deepcopy(SIDECAR)
    out["train"]["threads"] = out["determinism"]["threads"] = n
    return out


def test_differences_come_first_and_the_advice_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = drift_runs(tmp_path, with_threads(2))
    rc, out = diff(capsys, a, b)
    lines = out.splitlines()
    assert rc == 1
    assert lines[:3] == [
        "RECORDED_DIFFERENCES: 2",
        "  train.threads: run_A=1 run_B=2 (setting)",
        "  determinism.threads: run_A=1 run_B=2 (environment)",
    ]
    assert lines[3].startswith("FIRST_DIVERGENCE: step=10 leaf=grads.lora ")
    (advice,) = [ln for ln in lines if ln.startswith("advice: ")]
    assert advice.startswith(
        "advice: grads.lora: the runs' sidecars differ in train.threads (1 vs 2) and "
        "determinism.threads (1 vs 2): reduction order in the backward pass"
    )
    # the rest is the output of the bare diag files, unchanged
    _, bare = diff(capsys, tmp_path / "a.jsonl", tmp_path / "drift.jsonl")
    bare_advice = next(ln for ln in bare.splitlines() if ln.startswith("advice: "))
    assert advice.replace(
        "the runs' sidecars differ in train.threads (1 vs 2) and determinism.threads (1 vs 2): ", ""
    ) == bare_advice  # fmt: skip
    assert [ln for ln in lines[3:] if not ln.startswith("advice: ")] == [
        ln for ln in bare.splitlines() if not ln.startswith("advice: ")
    ]
    # a sidecar given as the diag file's directory works the same
    assert diff(capsys, a / "diag.jsonl", b / "diag.jsonl")[1] == out


def test_json_lists_the_differences_and_what_bears_on_the_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b_record = copy.deepcopy(SIDECAR)
    b_record["determinism"]["cpu_kernels"]["aten_capability"] = "AVX512"
    b_record["metrics"]["final_loss"] = 2.5  # a result: not a fact
    b_record["inputs"]["examples"] = "/elsewhere/ex.jsonl"  # a path: not a fact
    a, b = drift_runs(tmp_path, b_record)
    rc, out = diff(capsys, a, b, "--json")
    d = json.loads(out)
    assert rc == 1 and d["recorded_differences"] == [
        {"key": "determinism.cpu_kernels.aten_capability", "section": "determinism",
         "kind": "environment", "a": "AVX2", "b": "AVX512"},
    ]  # fmt: skip
    # grads.lora's advice names kernels: the CPU capability bears on it
    assert d["advice"]["recorded"] == ["determinism.cpu_kernels.aten_capability"]
    assert d["advice"]["cause"].startswith("reduction order")  # the table's own words


def test_agreeing_sidecars_print_nothing_new(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b_record = copy.deepcopy(SIDECAR)
    b_record["metrics"]["wall_s"] = 9.0
    a, b = drift_runs(tmp_path, b_record)
    _, out = diff(capsys, a, b)
    _, bare = diff(capsys, tmp_path / "a.jsonl", tmp_path / "drift.jsonl")
    assert out == bare and "RECORDED_DIFFERENCES" not in out
    d = json.loads(diff(capsys, a, b, "--json")[1])
    assert d["recorded_differences"] == [] and d["advice"]["recorded"] == []
    # one run without a sidecar: nothing to compare, no error, no key
    (b / "twinrun.json").unlink()
    assert diff(capsys, a, b)[1] == bare
    assert "recorded_differences" not in json.loads(diff(capsys, a, b, "--json")[1])


def test_an_unreadable_sidecar_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = drift_runs(tmp_path, SIDECAR)
    (b / "twinrun.json").write_text("[]")
    rc = run_cli(["diff", str(a), str(b)])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "" and "twinrun.json: a sidecar must be a JSON object" in out.err


@pytest.mark.slow  # three real SFT runs
def test_real_runs_at_another_thread_count(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    examples = write_examples(tmp_path / "data")["sft"]
    threads = torch.get_num_threads()
    runs = {}
    try:
        for name, n in (("a", "1"), ("b", "2"), ("c", "1")):
            args = run_args("sft", toy_model_dir, examples, tmp_path / name, "--diag")
            args[args.index("--threads") + 1] = n
            assert run_cli(args) == 0
            runs[name] = tmp_path / name
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    _, out = diff(capsys, runs["a"], runs["b"], "--bitwise")
    lines = out.splitlines()
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith(("FIRST_", "DETERMINISTIC")))
    assert lines[:verdict] == [
        "RECORDED_DIFFERENCES: 2",
        "  train.threads: run_A=1 run_B=2 (setting)",
        "  determinism.threads: run_A=1 run_B=2 (environment)",
    ]
    if lines[verdict].startswith("FIRST_DIVERGENCE"):  # two threads summed in another order
        advice = next(ln for ln in lines if ln.startswith("advice: "))
        assert "the runs' sidecars differ in" in advice and "threads (1 vs 2)" in advice
    # the same command twice: the sidecars agree and nothing new is printed
    rc, out = diff(capsys, runs["a"], runs["c"], "--bitwise")
    assert rc == 0 and out.startswith("DETERMINISTIC: 2 rows") and "RECORDED" not in out
    d = json.loads(diff(capsys, runs["a"], runs["c"], "--json")[1])
    assert d["recorded_differences"] == []
