"""Hostile inputs to training and resume: what is hashed is what is loaded, damaged safetensors
and checkpoints are one line (never a traceback, never a silent run), checkpoints verify
themselves. Every case asserts the line, the exit code and that nothing existing changed."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.integration.conftest import sft_args
from tests.integration.test_resume import assert_same_run, cli
from tests.integration.test_resume_inputs import snapshot
from twinrun.cli.main import run_cli

EXTRA = ("--diag", "--checkpoint-every", "1")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("twinrun: error: ") and "internal error" not in err, err
    return err


def copy_model(toy_model_dir: Path, where: Path) -> Path:
    shutil.copytree(toy_model_dir, where)
    return where


def killed(model: Path, examples: Path, run: Path, at: int = 2) -> list[str]:
    """A run SIGKILLed while writing checkpoint `at` (so `at - 1` complete checkpoints)."""
    args = sft_args(model, examples, run, 1, *EXTRA)
    res = cli(args, {"TWINRUN_CRASH_AT": f"checkpoint-mid-write:{at}"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    return args


# --- item 6: the model hash is what is loaded ---------------------------------------------


def test_index_pointing_outside_the_model_dir_is_refused(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import safe_open

    model = copy_model(toy_model_dir, tmp_path / "model")
    with safe_open(str(model / "model.safetensors"), framework="pt") as fh:
        names = list(fh.keys())
    shutil.move(model / "model.safetensors", tmp_path / "outside.safetensors")
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "../outside.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    before = snapshot(tmp_path)
    out = tmp_path / "run"
    assert run_cli(sft_args(model, sft_examples, out, 1)) == 2
    err = one_line(capsys)
    assert "names a shard outside" in err and "../outside.safetensors" in err
    assert not out.exists() and snapshot(tmp_path) == before


def test_swapped_shard_is_caught_on_resume(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from twinrun.model.toy import write_toy_checkpoint

    model = copy_model(toy_model_dir, tmp_path / "model")
    run = tmp_path / "run"
    args = killed(model, sft_examples, run)
    write_toy_checkpoint(tmp_path / "other", seed=1)
    shutil.copy(tmp_path / "other" / "model.safetensors", model / "model.safetensors")
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    assert "model sha256" in one_line(capsys)
    assert snapshot(run) == before


def test_byte_identical_copy_elsewhere_resumes_bit_exactly(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    first = copy_model(toy_model_dir, tmp_path / "a" / "model")
    moved = copy_model(toy_model_dir, tmp_path / "b" / "elsewhere")
    (moved / ".DS_Store").write_bytes(b"never read by the loader")
    ref = tmp_path / "ref"
    assert run_cli(sft_args(moved, sft_examples, ref, 1, *EXTRA)) == 0
    run = tmp_path / "run"
    args = killed(first, sft_examples, run)
    args[args.index("--model") + 1] = str(moved)
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)  # adapter_config.json names the model path: the one resumed on
