"""`--resume` refuses anything that shapes the bytes differently (flags, examples, model, initial
adapter) before touching a file, and restarts a run killed before its first checkpoint."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from tests.integration.test_resume import assert_same_run, cli
from twinrun.cli.main import run_cli
from twinrun.train.outputs.resume_check import INPUTS

EXTRA = ("--diag", "--checkpoint-every", "1")


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def killed_run(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> tuple[Path, list[str]]:
    """An SFT run SIGKILLed while writing its second checkpoint (one complete checkpoint)."""
    run = tmp_path_factory.mktemp("killed") / "run"
    args = sft_args(toy_model_dir, sft_examples, run, 1, *EXTRA)
    res = cli(args, {"TWINRUN_CRASH_AT": "checkpoint-mid-write:2"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert (run / INPUTS).is_file() and (run / "diag.jsonl").is_file()
    return run, args


def other_examples(tmp_path: Path, sft_examples: Path) -> Path:
    lines = sft_examples.read_text().splitlines()
    out = tmp_path / "reordered.jsonl"
    out.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # same rows, reordered
    return out


def other_model(tmp_path: Path) -> Path:
    from twinrun.model.toy import write_toy_checkpoint

    out = tmp_path / "model2"
    write_toy_checkpoint(out, seed=1)
    return out


@pytest.mark.parametrize("change", ["examples", "model", "learning-rate"])
def test_resume_refuses_other_inputs_and_touches_nothing(
    tmp_path: Path,
    killed_run: tuple[Path, list[str]],
    sft_examples: Path,
    capsys: pytest.CaptureFixture[str],
    change: str,
) -> None:
    run, args = killed_run
    before = snapshot(run)
    changed = [*args, "--resume"]
    i = changed.index(f"--{change}") + 1
    changed[i] = {
        "examples": lambda: str(other_examples(tmp_path, sft_examples)),
        "model": lambda: str(other_model(tmp_path)),
        "learning-rate": lambda: "0.5",
    }[change]()
    assert run_cli(changed) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "differ from the recorded run" in err
    expect = {"examples": "data sha256", "model": "model sha256", "learning-rate": "learning_rate"}
    assert expect[change] in err
    assert snapshot(run) == before  # not even diag.jsonl was trimmed


def test_resume_after_refusals_still_bit_exact(
    tmp_path: Path, killed_run: tuple[Path, list[str]], toy_model_dir: Path, sft_examples: Path
) -> None:
    run, args = killed_run
    ref = tmp_path / "ref"
    assert run_cli(sft_args(toy_model_dir, sft_examples, ref, 1, *EXTRA)) == 0
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)


def test_killed_before_first_checkpoint_restarts_under_resume(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    ref, run = tmp_path / "ref", tmp_path / "killed"
    assert run_cli(sft_args(toy_model_dir, sft_examples, ref, 1, *EXTRA)) == 0
    args = sft_args(toy_model_dir, sft_examples, run, 1, *EXTRA)
    res = cli(args, {"TWINRUN_CRASH_AT": "checkpoint-mid-write:1"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert not any((run / "checkpoints").glob("step-*"))  # no complete checkpoint at all
    assert (run / "diag.jsonl").read_text()  # but a partial log
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(ref, run)


def test_resume_of_a_finished_run_without_checkpoints_is_refused(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = sft_args(toy_model_dir, sft_examples, run, 1)
    assert run_cli(args) == 0
    before = snapshot(run)
    assert run_cli([*args, "--resume"]) == 2
    assert "holds a finished run" in capsys.readouterr().err
    assert snapshot(run) == before
