"""Bad model directories and settings on a real checkpoint: each is one line on stderr saying
what is wrong (and what to do), a non-zero exit, and no run directory or report written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.real.test_smollm2_cli import model_copy, one_line_error, sft_args
from tests.real.test_smollm2_numbers import examples_file
from twinrun.cli.main import run_cli

pytestmark = pytest.mark.real


def short_sft(model: Path, out: Path, data: Path, *extra: str) -> list[str]:
    args = sft_args(model, out)
    args[args.index("--examples") + 1] = str(data)
    return [*args, *extra]


def edit_config(model: Path, **changes: object) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | changes))


def fails_writing_nothing(
    args: list[str], out: Path, capsys: pytest.CaptureFixture[str], *needles: str
) -> str:
    capsys.readouterr()
    assert run_cli(args) != 0
    assert not out.exists()
    return one_line_error(capsys, *needles)


def test_no_config_json(smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    (model / "config.json").unlink()
    out = tmp_path / "run"
    fails_writing_nothing(short_sft(model, out, examples_file(tmp_path, 2)), out, capsys,
                          f"no config.json in {model}")  # fmt: skip


def test_no_weights(smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    out = tmp_path / "run"
    fails_writing_nothing(short_sft(model, out, examples_file(tmp_path, 2)), out, capsys,
                          f"no safetensors weights in {model}", "save_pretrained")  # fmt: skip


def test_pickle_only_weights_are_refused_with_the_conversion(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    canary = tmp_path / "unpickled"
    # a pickle that would write `canary` if anything ever unpickled it
    (model / "pytorch_model.bin").write_bytes(
        b"cos\nsystem\n(S'touch " + str(canary).encode() + b"'\ntR."
    )
    out = tmp_path / "run"
    err = fails_writing_nothing(
        short_sft(model, out, examples_file(tmp_path, 2)), out, capsys,
        "pickle weights only (pytorch_model.bin)", "save_pretrained(DIR)", "model.safetensors",
    )  # fmt: skip
    assert "never loads" in err and not canary.exists()


@pytest.mark.parametrize(("model_type", "needle"), [("vit", "'vit'"), ("t5", "'t5'")])
def test_not_a_causal_lm(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, model_type: str, needle: str
) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    edit_config(model, model_type=model_type)
    out = tmp_path / "run"
    args = short_sft(model, out, examples_file(tmp_path, 2))
    fails_writing_nothing(args, out, capsys, needle, "not a causal", "AutoModelForCausalLM")


def test_a_row_longer_than_the_positions_is_named(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    edit_config(model, max_position_embeddings=41)
    data = examples_file(tmp_path, 8)  # 41, 40, 41, 40, 41, 40, 42, 40 tokens with the template
    out = tmp_path / "run"
    fails_writing_nothing(short_sft(model, out, data), out, capsys,
                          f"{data.name}:7: 42 tokens exceed the row limit of 41")  # fmt: skip
    report = tmp_path / "eval.json"
    args = ["tune", "evaluate", "--model", str(model), "--examples", str(data),
            "--chat-template", "on", "--precision", "f32", "--batch-size", "2",
            "--output", str(report), "--threads", "1"]  # fmt: skip
    fails_writing_nothing(
        args, report, capsys, f"{data.name}:7: 42 tokens exceed the row limit of 41"
    )


def test_unknown_lora_target(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    data = examples_file(tmp_path, 2)
    args = short_sft(smollm2_dir, out, data, "--lora-targets", "q_proj,qkv")
    fails_writing_nothing(args, out, capsys, "not found in the model", "'qkv'", "q_proj")
