"""`--lr-schedule wsd|constant|linear` runs reproduce their bytes, follow their schedule step by
step and record it; a bad schedule is one line and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli

ADAPTER = "adapter_model.safetensors"


def schedule_args(model: Path, examples: Path, out: Path, schedule: list[str]) -> list[str]:
    args = sft_args(model, examples, out, 1, "--epochs", "2")  # 16 examples / 4: 8 steps
    i = args.index("--lr-schedule")
    return [*args[:i], *schedule, *args[i + 2 :]]


@pytest.mark.parametrize(
    ("schedule", "lrs"),
    [
        # W=1, T=8, D=3: warmup 0, stable 1..4, decay 5..7 as 1e-2 * (7 - s) / 3
        (["--lr-schedule", "wsd", "--decay-steps", "3"],
         [1e-2] * 5 + [1e-2 * 2 / 3, 1e-2 / 3, 0.0]),
        (["--lr-schedule", "constant"], [1e-2] * 8),
        # transformers' linear after the warmup: 1e-2 * (8 - s) / 7, 1e-2 / 7 at the last step
        (["--lr-schedule", "linear"], [1e-2] + [1e-2 * (8 - s) / 7 for s in range(1, 8)]),
    ],
)  # fmt: skip
def test_wsd_constant_and_linear_runs_reproduce_bytes(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, schedule: list[str], lrs: list
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert run_cli(schedule_args(toy_model_dir, sft_examples, out, schedule)) == 0
    assert (a / ADAPTER).read_bytes() == (b / ADAPTER).read_bytes()
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == lrs
    train = json.loads((a / "twinrun.json").read_text())["train"]
    assert train["lr_schedule"] == schedule[1]
    assert train["decay_steps"] == (3 if schedule[1] == "wsd" else None)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (["--lr-schedule", "wsd"], "--lr-schedule wsd needs --decay-steps"),
        (["--lr-schedule", "wsd", "--decay-steps", "8"],
         "--warmup-steps 1 + --decay-steps 8 exceed the 8-step run"),
        (["--lr-schedule", "constant", "--decay-steps", "2"],
         "--decay-steps applies to --lr-schedule wsd only"),
        ([], "missing required flag: --lr-schedule"),
    ],
)  # fmt: skip
def test_bad_schedules_are_one_line_errors_and_write_nothing(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str],
    schedule: list[str], message: str,
) -> None:  # fmt: skip
    out = tmp_path / "run"
    capsys.readouterr()
    assert run_cli(schedule_args(toy_model_dir, sft_examples, out, schedule)) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists()
