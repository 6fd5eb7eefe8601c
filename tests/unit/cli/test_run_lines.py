"""The lines a user reads around a run: `--version` names the libraries a run records, the
end-of-run summary says the time, the output and (GRPO) the reward, and the progress line of a
sampling run shows its reward, not only its loss."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

from twinrun.cli.tune import print_run_summary
from twinrun.train.step.loop import StepOutcome, progress_text


def test_version_names_the_libraries_and_imports_none() -> None:
    code = (
        "import sys\n"
        "from twinrun.cli.main import run_cli\n"
        "assert run_cli(['--version']) == 0\n"
        "assert 'torch' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    first, libraries, platform_line = res.stdout.splitlines()
    assert first == f"twinrun {version('twinrun')}"
    for package in ("torch", "transformers", "peft", "safetensors", "numpy"):
        assert f"{package} {version(package)}" in libraries
    assert platform_line.startswith("platform ")


def record(**metrics: float) -> dict:
    return {
        "train": {"objective": "grpo" if "final_reward_mean" in metrics else "sft"},
        "metrics": {"steps": 4, "final_loss": 0.25, "wall_s": 12.34, **metrics},
        "adapter": {"sha256": "ab" * 32},
    }


def test_the_summary_says_time_output_and_reward(capsys: pytest.CaptureFixture[str]) -> None:
    print_run_summary(record(), False, "runs/sft")
    assert capsys.readouterr().out == (
        f"sft: 4 steps in 12.3 s, final loss 0.250000, adapter sha256 {'ab' * 32}, "
        "written to runs/sft\n"
    )
    print_run_summary(record(final_reward_mean=0.5), False, "runs/grpo")
    out = capsys.readouterr().out
    assert out.startswith("grpo: 4 steps in 12.3 s, final loss 0.250000, final mean reward 0.5000,")
    print_run_summary(record(), True, "runs/sft")  # --quiet
    assert capsys.readouterr().out == ""


def test_a_sampling_run_s_progress_shows_its_reward() -> None:
    grpo = StepOutcome(loss=0.0, tokens=1, rows=1, metrics={"reward_mean": 0.5, "reward_std": 0.25})
    assert progress_text(grpo, 1e-3) == "reward 0.500 ± 0.250 loss 0.0000 lr 1.00e-03"
    sft = StepOutcome(loss=1.5, tokens=1, rows=1, metrics={"epoch": 0})
    assert progress_text(sft, 1e-3) == "loss 1.5000 lr 1.00e-03"
