"""Lines that used to name the wrong cause: a model path that is a file ("does not exist"), a
batch larger than the data (a warm-up complaint first), a YAML config ("not valid TOML"),
`--device cuda` ("must be cpu or cuda:N", though the docs say to give it). Each is one line
saying what it is, exit 2, nothing written. And a `--stop-after` run's progress counts the steps
it does, not the plan's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from testkit.toy_runs import sft_args
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
    assert line.startswith(  # the cause first, then the warm-up it leaves no room for
        "twinrun: error: one step takes 1000 examples (--batch-size 1000 x --accumulation 1) "
        "and the data has 16: the run has 1 step(s), and --warmup-steps 1 leaves no step of the "
        "1-step run to decay — give more examples or a smaller --batch-size / --accumulation"
    ), line
    assert not out.exists()


def test_device_cuda_on_one_process_is_cuda_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/distributed.md says `--device cuda`: on one process it is cuda:0, under torchrun
    cuda:LOCAL_RANK; any other name is refused."""
    from twinrun.core.determinism import parse_device
    from twinrun.core.errors import ConfigError
    from twinrun.train.parallel.distributed import process_device, setup

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert (parse_device("cuda"), parse_device("cuda:3"), parse_device("cpu")) == (0, 3, None)
    assert process_device("cuda") == setup("cuda") == "cuda:0"
    assert process_device("cuda:1") == "cuda:1" and process_device("cpu") == "cpu"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert process_device("cuda") == process_device("cuda:0") == "cuda:1"
    with pytest.raises(ConfigError, match=r"--device must be cpu, cuda or cuda:N"):
        parse_device("gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device would run the command")
def test_device_cuda_is_refused_as_cuda_0_where_there_is_none(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--device", "cuda")) == 2
    line = one_line(capsys)
    assert "--device cuda:0 asked for but no CUDA device is available — use --device cpu" in line
    assert not out.exists()


def test_progress_counts_the_steps_a_stop_after_run_does(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """16 examples at batch 4 plan 4 steps; `--stop-after 2` runs 2, and says 1/2 and 2/2."""
    argv = sft_args(toy_model_dir, sft_examples, tmp_path / "run", 1, "--stop-after", "2")
    argv.remove("--quiet")
    assert run_cli(argv) == 0
    steps = [x for x in capsys.readouterr().err.splitlines() if x.startswith("sft step ")]
    assert [x.split()[2] for x in steps] == ["1/2", "2/2"], steps


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
