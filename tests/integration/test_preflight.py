"""Path mistakes in a training command are refused in one line before torch loads: the output,
the model directory and every data file are checked first (`train/setup/preflight.py`) with the
session's own checks, in a fresh process that must not have imported torch at the refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from twinrun.data.examples import shipped_examples

COMMON = [
    "--seed", "1", "--learning-rate", "1e-3", "--warmup-steps", "0", "--lr-schedule", "constant",
    "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32", "--threads", "1",
]  # fmt: skip


def sft(model: Path, examples: Path, out: Path, *extra: str) -> list[str]:
    return ["tune", "sft", "--model", str(model), "--examples", str(examples), "--output",
            str(out), "--epochs", "1", "--batch-size", "1", "--accumulation", "1",
            "--chat-template", "on", *COMMON, *extra]  # fmt: skip


def text(model: Path, corpus: Path, out: Path) -> list[str]:
    return ["tune", "text", "--model", str(model), "--corpus", str(corpus), "--output", str(out),
            "--steps", "1", "--window", "8", "--windows-per-step", "1", "--batch-size", "1",
            *COMMON]  # fmt: skip


def test_path_mistakes_are_refused_before_torch_loads(tmp_path: Path, toy_model_dir: Path) -> None:
    good = tmp_path / "sft.jsonl"
    good.write_bytes(shipped_examples("sft.jsonl").read_bytes())
    afile = tmp_path / "afile.txt"
    afile.write_text("x")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    out = tmp_path / "out"
    cases = {
        "model directory /nonexist does not exist": sft(Path("/nonexist"), good, out),
        "is a file, not a checkpoint directory": sft(afile, good, out),
        "check the --examples path": sft(toy_model_dir, tmp_path / "typo.jsonl", out),
        "check the --eval-examples path": sft(
            toy_model_dir,
            good,
            out,
            "--eval-examples",
            str(tmp_path / "eval-typo.jsonl"),
            "--eval-every",
            "1",
        ),
        f"corpus file {tmp_path / 'no.txt'} does not exist": text(
            toy_model_dir, tmp_path / "no.txt", out
        ),
        "exists and is not empty": sft(toy_model_dir, good, foreign),
    }
    argvs = list(cases.values())
    code = (
        "import json, sys; from twinrun.cli.main import run_cli; "
        f"print(json.dumps([[run_cli(a), 'torch' in sys.modules] for a in {argvs!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    results = json.loads(done.stdout.splitlines()[-1])
    lines = done.stderr.strip().splitlines()
    assert results == [[2, False]] * len(cases), done.stderr
    assert len(lines) == len(cases), lines  # one line each
    for line, (expected, _) in zip(lines, cases.items(), strict=True):
        assert line.startswith("twinrun: error: ") and expected in line, (expected, line)
    assert not out.exists()
    assert sorted(p.name for p in foreign.iterdir()) == ["mine.txt"]


def test_other_commands_refuse_a_wrong_path_before_torch_loads(tmp_path: Path) -> None:
    cases = {
        f"{tmp_path} has no twinrun.json": ["reproduce", str(tmp_path), "--output",
                                            str(tmp_path / "rep")],
        "golden folder /nonexist does not exist": ["golden", "check", "/nonexist"],
        "model directory /nonexist does not exist": [
            "init-adapter", str(tmp_path / "init"), "--model", "/nonexist", "--seed", "1",
            "--lora-rank", "4", "--lora-alpha", "8",
        ],
    }  # fmt: skip
    missing_model = [  # generate and extract: the same line for a missing model
        ["generate", "--model", "/nonexist", "--prompt", "p", "--max-new-tokens", "1",
         "--temperature", "1", "--seed", "1", "--chat-template", "on", "--precision", "f32",
         "--threads", "1"],
        ["extract", "--model", "/nonexist", "--examples", "e", "--layer", "1", "--pool", "last",
         "--chat-template", "on", "--precision", "f32", "--batch-size", "1", "--output",
         str(tmp_path / "o.safetensors"), "--threads", "1"],
    ]  # fmt: skip
    argvs = [*cases.values(), *missing_model]
    code = (
        "import json, sys; from twinrun.cli.main import run_cli; "
        f"print(json.dumps([[run_cli(a), 'torch' in sys.modules] for a in {argvs!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [[2, False]] * len(argvs), done.stderr
    printed = done.stdout + done.stderr
    for expected in cases:
        assert expected in printed, (expected, printed)
    assert printed.count("model directory /nonexist does not exist") == 3
    assert list(tmp_path.iterdir()) == []
