"""Lines that used to name the wrong cause: a model path that is a file ("does not exist"), a
batch larger than the data (a bare warm-up complaint), a YAML config ("not valid TOML"). Each is
one line saying what it is, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import sft_args
from twinrun.cli.main import run_cli


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_model_path_that_is_a_file(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = sft_args(toy_model_dir / "config.json", sft_examples, out, 1)
    assert run_cli(argv) == 2
    line = one_line(capsys)
    assert f"--model {toy_model_dir / 'config.json'} is a file, not a checkpoint directory" in line
    assert "does not exist" not in line and not out.exists()


def test_a_batch_larger_than_the_data_says_where_the_step_count_came_from(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = sft_args(toy_model_dir, sft_examples, out, 1)
    argv[argv.index("--batch-size") + 1] = "1000"  # 16 examples; warm-up 1 of the 1 step
    assert run_cli(argv) == 2
    line = one_line(capsys)
    assert "--warmup-steps 1 leaves no step of the 1-step run to decay (16 examples at " in line
    assert "--batch-size 1000 x --accumulation 1 make 1 step(s) an epoch, 1 epoch(s))" in line
    assert "— one step takes 1000 examples and the data has 16: give more examples or a " in line
    assert not out.exists()


@pytest.mark.parametrize(("name", "kind"), [("run.yaml", "YAML"), ("run.json", "JSON")])
def test_a_yaml_or_json_config_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, kind: str
) -> None:
    config = tmp_path / name
    config.write_text("training:\n  trainer: sft\n" if kind == "YAML" else '{"training": {}}\n')
    assert run_cli(["run", str(config)]) == 2
    line = one_line(capsys)
    assert f"{config}: a {kind} file; `twinrun run` reads TOML configs" in line
    assert "not valid TOML" not in line
