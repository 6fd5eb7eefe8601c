"""`twinrun launch` (torchrun's arguments): a refusal reads as one line — the line every process
prints, said once, and no torchrun report after it — with the process's exit status (2), where
plain torchrun adds its ~40-line `ChildFailedError` report and exits 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit.toy_runs import run_args
from tests.distributed.launch import launch_env


def test_a_refusal_under_twinrun_launch_is_one_line(tmp_path: Path, toy_model_dir: Path) -> None:
    out = tmp_path / "out"
    examples = Path(__file__).parents[2] / "src/twinrun/examples/sft.jsonl"
    args = run_args("sft", toy_model_dir, examples, out)
    args[args.index("--model") + 1] = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a Hub id
    torchrun, env = launch_env(2, ["-m", "twinrun", *args])
    plain = subprocess.run(torchrun, env=env, capture_output=True, text=True, timeout=180)
    assert plain.returncode == 1 and "ChildFailedError" in plain.stderr
    assert len(plain.stderr.splitlines()) > 30, plain.stderr  # torchrun's report after the lines

    ours = [sys.executable, "-m", "twinrun", "launch", *torchrun[3:]]  # torchrun's arguments
    launched = subprocess.run(ours, env=env, capture_output=True, text=True, timeout=180)
    assert launched.returncode == 2, launched.stderr
    assert launched.stderr.splitlines() == [
        "twinrun: error: model directory HuggingFaceTB/SmolLM2-135M-Instruct does not exist — "
        "HuggingFaceTB/SmolLM2-135M-Instruct looks like a Hugging Face Hub id, and --model takes "
        "a local directory: `hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir DIR`, "
        "then --model DIR"
    ]
    assert not out.exists()
