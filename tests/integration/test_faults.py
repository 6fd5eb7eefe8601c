"""Fault injection (docs/diagnostics.md): each planted fault is localised by
`twinrun diff --bitwise` to its own leaf at the injected step; two clean same-seed runs diff as
deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli


def test_clean_runs_are_deterministic(
    sft_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ([], ["--bitwise"]):
        capsys.readouterr()
        assert run_cli(["diff", str(sft_runs["a"]), str(sft_runs["b"]), *extra]) == 0
        assert capsys.readouterr().out.startswith("DETERMINISTIC")


@pytest.mark.parametrize(
    ("fault", "leaf"),
    [
        ("sampler@2", "batch.sample_indices"),
        ("rng@1", "rng.state"),
        ("reduction@1", "grads.lora"),
    ],
)
def test_fault_is_localised(
    tmp_path: Path,
    toy_model_dir: Path,
    sft_examples: Path,
    sft_runs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    fault: str,
    leaf: str,
) -> None:
    out = tmp_path / "faulty"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--diag", "--inject", fault)) == 0
    capsys.readouterr()
    assert run_cli(["diff", str(sft_runs["a"]), str(out), "--bitwise"]) == 1
    lines = capsys.readouterr().out.splitlines()
    # the sidecars record the planted fault: that fact comes first, then where it shows
    assert lines[:2] == [
        "RECORDED_DIFFERENCES: 1",
        f'  train.inject: run_A=[] run_B=["{fault}"] (setting)',
    ]
    step = fault.split("@")[1]
    assert lines[2].startswith(f"FIRST_DIVERGENCE: step={step} leaf={leaf} "), lines[2]
